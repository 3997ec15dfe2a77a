//! The in-memory side of each workload's search: its valid configs, its tuner, the configs that
//! already have a task and the outcomes of those that finished. All of it is derived from the
//! database (and rebuilt after a restart); it lives in memory because enumerating a template's
//! space against a device walks hundreds of thousands of points, and a model tuner also needs
//! every valid config's feature row.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use tensortune_kernels::{Config, Target, Template, Workload};
use tensortune_search::features;
use tensortune_search::tuner::{Candidate, Prior};

use crate::error::{Error, Result};
use crate::model::{JobId, Status};
use crate::store::records::PriorRecord;
use crate::tuner::{Observed, Taken, Tuner, WorkloadSpace};

/// Identifies a workload of a job.
pub(crate) type SearchKey = (JobId, u32);

/// One workload's search.
pub(crate) struct Search {
    tuner: Arc<dyn Tuner>,
    /// Config indices that have a task (in any state), mirroring the tasks table.
    taken: HashSet<u64>,
    /// Outcomes of its finished trials, in the order they finished (the `trial` column).
    observed: Vec<Observed>,
}

impl Search {
    /// A search with `tuner` that continues after the configs in `taken`, whose finished trials
    /// measured `observed`.
    pub(crate) fn new(tuner: Arc<dyn Tuner>, taken: impl IntoIterator<Item = u64>, observed: Vec<Observed>) -> Search {
        Search { tuner, taken: taken.into_iter().collect(), observed }
    }

    /// Up to `n` configs to propose next, skipping those taken and those in `pending` (proposed in
    /// a write that has not committed yet), given the outcomes so far plus `fresh` (finished in
    /// that write). A tuner whose proposals are CPU work runs on a blocking thread, on copies.
    pub(crate) async fn propose(
        &self,
        pending: Option<&HashSet<u64>>,
        fresh: &[Observed],
        n: usize,
    ) -> Result<Vec<u64>> {
        if !self.tuner.blocking() {
            let observed: Vec<Observed> = self.observations(fresh).collect();
            return Ok(self.tuner.propose(&observed, &Taken { committed: &self.taken, pending }, n));
        }
        let tuner = Arc::clone(&self.tuner);
        let observed: Vec<Observed> = self.observations(fresh).collect();
        let committed = self.taken.clone();
        let pending = pending.cloned();
        let task = tokio::task::spawn_blocking(move || {
            tuner.propose(&observed, &Taken { committed: &committed, pending: pending.as_ref() }, n)
        });
        Ok(task.await?)
    }

    /// The outcomes so far, then `fresh`.
    pub(crate) fn observations<'a>(&'a self, fresh: &'a [Observed]) -> impl Iterator<Item = Observed> + 'a {
        self.observed.iter().chain(fresh).copied()
    }

    /// Marks configs as having a task (after the write that created them committed).
    pub(crate) fn take(&mut self, configs: impl IntoIterator<Item = u64>) {
        self.taken.extend(configs);
    }

    /// Adds outcomes of finished trials (after the write that stored them committed).
    pub(crate) fn observe(&mut self, outcomes: impl IntoIterator<Item = Observed>) {
        self.observed.extend(outcomes);
    }
}

/// The searches of every running workload, and the transfer prior of each job that has one.
#[derive(Default)]
pub(crate) struct Searches {
    map: HashMap<SearchKey, Search>,
    /// One per job, shared by its workloads' model tuners; kept here so that a workload whose
    /// search is reloaded (after a restart or a failed write) does not rebuild it.
    priors: HashMap<JobId, Arc<Prior>>,
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

    /// The transfer prior of a job, if built.
    pub(crate) fn prior(&self, job: JobId) -> Option<Arc<Prior>> {
        self.priors.get(&job).cloned()
    }

    /// Keeps the transfer prior of a job.
    pub(crate) fn insert_prior(&mut self, job: JobId, prior: Arc<Prior>) {
        self.priors.insert(job, prior);
    }

    /// Forgets the searches of a workload (it stopped) or of a whole job (`idx` `None`, with its
    /// prior).
    pub(crate) fn remove(&mut self, job: JobId, idx: Option<u32>) {
        self.map.retain(|(j, i), _| *j != job || idx.is_some_and(|idx| idx != *i));
        if idx.is_none() {
            self.priors.remove(&job);
        }
    }

    /// Forgets everything written by a write that failed: it is reloaded from the database.
    pub(crate) fn remove_keys(&mut self, keys: impl IntoIterator<Item = SearchKey>, priors: &[JobId]) {
        for key in keys {
            self.map.remove(&key);
        }
        for job in priors {
            self.priors.remove(job);
        }
    }
}

/// Why a workload's space could not be prepared.
pub(crate) enum SpaceError {
    /// The template rejects the workload at this position of the list given.
    Workload(usize, tensortune_kernels::Error),
    /// Something else failed (features of a valid config).
    Internal(Error),
}

/// The space of each of `workloads` for `template` on `target`: its valid config indices and, when
/// `features` is set, every valid config's candidate (feature row, knob positions, analytic time).
/// Computed on a blocking thread (a space has hundreds of thousands of points); identical workloads
/// are computed once.
pub(crate) async fn spaces(
    template: &'static dyn Template,
    workloads: Vec<Workload>,
    target: Target,
    features: bool,
) -> Result<Result<Vec<WorkloadSpace>, SpaceError>> {
    let task = tokio::task::spawn_blocking(move || {
        let mut by_key: HashMap<String, WorkloadSpace> = HashMap::new();
        let mut out = Vec::with_capacity(workloads.len());
        for (i, w) in workloads.iter().enumerate() {
            let key = w.key();
            if let Some(s) = by_key.get(&key) {
                out.push(s.clone());
                continue;
            }
            let valid: Arc<[u64]> = template.valid_indices(w, &target).map_err(|e| SpaceError::Workload(i, e))?.into();
            let candidates = if features {
                Some(candidates(template, w, &target, &valid).map_err(SpaceError::Internal)?.into())
            } else {
                None
            };
            let space = WorkloadSpace { valid, candidates };
            by_key.insert(key, space.clone());
            out.push(space);
        }
        Ok(out)
    });
    Ok(task.await?)
}

/// The candidates of a model search: each of `valid` with its feature row.
fn candidates(template: &dyn Template, w: &Workload, target: &Target, valid: &[u64]) -> Result<Vec<Candidate>> {
    let space = template.space();
    valid
        .iter()
        .map(|&index| {
            let config = space.config(index).map_err(|e| features_error(template, w, index, &e))?;
            let knobs = space.positions(&config).map_err(|e| features_error(template, w, index, &e))?;
            let (features, analytic_us) =
                features::row(template, w, &config, target).map_err(|e| features_error(template, w, index, &e))?;
            Ok(Candidate { index, features, knobs, analytic_us })
        })
        .collect()
}

fn features_error(template: &dyn Template, w: &Workload, index: u64, e: &dyn std::fmt::Display) -> Error {
    Error::Internal(format!(
        "config {index} of {} v{} for {} has no feature row: {e}",
        template.name(),
        template.version(),
        w.key()
    ))
}

/// A model's transfer prior from stored records (the store's `prior_records`: other workloads of
/// the device class, template and version), computed on a blocking thread. Each workload's records
/// are one group: per config its fastest ok time, or a failure when none was ok. Configs that the
/// current space does not know any more, and workloads that do not parse, are skipped.
pub(crate) async fn prior(template: &'static dyn Template, target: Target, records: Vec<PriorRecord>) -> Result<Prior> {
    let task = tokio::task::spawn_blocking(move || {
        // Ordered maps: the prior's row order (and so the model fitted on it) must not depend on
        // hashing, or a restarted tracker would propose differently.
        let mut groups: BTreeMap<String, (Workload, BTreeMap<String, Option<f64>>)> = BTreeMap::new();
        for r in records {
            let ok = (r.status == Status::Ok && r.median_us > 0.0).then_some(r.median_us);
            let (_, configs) = groups.entry(r.workload_key).or_insert_with(|| (r.workload.0, BTreeMap::new()));
            let slot = configs.entry(r.config).or_insert(None);
            *slot = match (*slot, ok) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        let space = template.space();
        let mut prior = Prior::default();
        for (workload, configs) in groups.into_values() {
            let mut rows = Vec::with_capacity(configs.len());
            let mut times = Vec::with_capacity(configs.len());
            for (config, time) in configs {
                let Ok(config) = Config::from_json(&config) else { continue };
                if space.index_of(&config).is_err() {
                    continue;
                }
                let Ok((row, _)) = features::row(template, &workload, &config, &target) else { continue };
                rows.push(row);
                times.push(time);
            }
            if !rows.is_empty() {
                prior.extend(features::workload_row(&workload), rows, &times);
            }
        }
        prior
    });
    Ok(task.await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tuner::TunerKind;

    fn grid(valid: &Arc<[u64]>) -> Arc<dyn Tuner> {
        let space = WorkloadSpace { valid: Arc::clone(valid), candidates: None };
        TunerKind::Grid.build(&space, 1, 0, None).unwrap()
    }

    #[tokio::test]
    async fn pending_proposals_are_skipped_and_taken_after_commit() {
        let valid: Arc<[u64]> = (0..10u64).collect();
        let mut s = Search::new(grid(&valid), [0, 1], Vec::new());
        let pending: HashSet<u64> = [2].into();
        assert_eq!(s.propose(Some(&pending), &[], 2).await.unwrap(), vec![3, 4]);
        s.take([2, 3, 4]);
        assert_eq!(s.propose(None, &[], 100).await.unwrap(), vec![5, 6, 7, 8, 9]);
        s.observe([Observed { config: 0, time_us: Some(3.0) }]);
        let fresh = [Observed { config: 1, time_us: None }];
        assert_eq!(s.observations(&fresh).map(|o| o.config).collect::<Vec<_>>(), [0, 1]);
    }

    #[test]
    fn removing_a_job_keeps_other_jobs() {
        let valid: Arc<[u64]> = (0..10u64).collect();
        let mut all = Searches::default();
        for key in [(1, 0), (1, 1), (2, 0)] {
            all.insert(key, Search::new(grid(&valid), [], Vec::new()));
        }
        all.insert_prior(1, Arc::new(Prior::default()));
        all.remove(1, Some(1));
        assert!(all.get((1, 0)).is_some() && all.get((1, 1)).is_none() && all.prior(1).is_some());
        all.remove(1, None);
        assert!(all.get((1, 0)).is_none() && all.get((2, 0)).is_some() && all.prior(1).is_none());
    }
}
