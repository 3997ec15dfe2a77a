//! Tuners: which configs of a workload's valid space to measure next.
//!
//! A job's space may hold several templates (a job that names none searches every template that
//! supports the workload): a candidate is then a [`Point`], a template's slot in the job's list and
//! a config index in that template's space. `random` shuffles the union, `grid` takes the templates
//! in turns, each in index order, and `model` learns over rows of the union's layout
//! (`tensortune_search::features::UnionLayout`).
//!
//! A tuner is rebuilt from the job's seed and the valid configs whenever the tracker needs it (at
//! submit, and after a restart), and it is told which configs already have a task and what the
//! finished ones measured, in the order they finished: everything it proposes follows from the
//! database, so a restarted tracker continues exactly where it stopped.
//!
//! `random` and `grid` ignore the outcomes. `model` is the search crate's model-guided tuner: it
//! proposes positions into a list of candidates (each valid config with its feature row), refits
//! its cost model on every proposal (one per batch), and may start from a prior of other
//! workloads' records.

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};

use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;
use rand::seq::SliceRandom;
use tensortune_search::features::UnionLayout;
use tensortune_search::tuner::{Candidate, ModelGuided, Observation, Prior, Tuner as _};

use crate::error::{Error, Result};

/// The search strategies a job can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TunerKind {
    /// A seeded random permutation of the valid configs.
    Random,
    /// The valid configs in index order.
    Grid,
    /// A cost model over feature rows, refitted on every outcome (optionally with transfer).
    Model,
}

impl TunerKind {
    /// Every kind, for error messages.
    pub(crate) const ALL: [TunerKind; 3] = [TunerKind::Random, TunerKind::Grid, TunerKind::Model];

    /// Lowercase name, as requested and stored.
    pub(crate) fn name(self) -> &'static str {
        match self {
            TunerKind::Random => "random",
            TunerKind::Grid => "grid",
            TunerKind::Model => "model",
        }
    }

    /// Whether the tuner needs each valid config's feature row (its [`Candidate`]).
    pub(crate) fn needs_features(self) -> bool {
        self == TunerKind::Model
    }

    /// Whether a workload asks the tuner for whole batches, rather than topping up as results
    /// come: the next one once no more than `tensortune_search::tuner::lookahead` of the last are
    /// outstanding, chosen around those (so that the worker compiles it while they measure). The
    /// model-guided tuner chooses a batch as a whole (the best predictions, spread out, plus an
    /// exploration share of the batch): asked for one config at a time it never explores.
    pub(crate) fn proposes_batches(self) -> bool {
        self == TunerKind::Model
    }

    /// A tuner over `space` for workload `workload_idx` of a job seeded with `seed`; `prior` is
    /// the model's transfer data (only `model` reads it).
    pub(crate) fn build(
        self,
        space: &WorkloadSpace,
        seed: u64,
        workload_idx: u32,
        prior: Option<Arc<Prior>>,
    ) -> Result<Arc<dyn Tuner>> {
        Ok(match self {
            TunerKind::Random => Arc::new(Random::new(&space.valid, seed, workload_idx)),
            TunerKind::Grid => Arc::new(Grid::new(&space.valid)),
            TunerKind::Model => {
                let candidates = space.candidates.clone().ok_or_else(|| {
                    Error::Internal("a model search was built without its candidates' features".to_owned())
                })?;
                Arc::new(Model {
                    valid: Arc::clone(&space.valid),
                    candidates,
                    inner: Mutex::new(ModelGuided::new(stream(seed, workload_idx), prior)),
                })
            }
        })
    }
}

impl fmt::Display for TunerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TunerKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        TunerKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| {
            let names: Vec<_> = TunerKind::ALL.iter().map(|k| k.name()).collect();
            format!("unknown tuner {s:?}; known: {}", names.join(", "))
        })
    }
}

/// One candidate of a job's space: a config of one of the job's templates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Point {
    /// The template's position in the job's list of templates (`jobs.templates`).
    pub(crate) slot: u32,
    /// The config's index in that template's space.
    pub(crate) index: u64,
}

impl Point {
    /// Config `index` of the template in `slot`.
    pub(crate) fn new(slot: u32, index: u64) -> Point {
        Point { slot, index }
    }
}

/// A workload's valid configs (ascending: by slot, then index) and, for tuners that need features,
/// their candidates in the same order.
#[derive(Clone)]
pub(crate) struct WorkloadSpace {
    pub(crate) valid: Arc<[Point]>,
    pub(crate) candidates: Option<Arc<[Candidate]>>,
    /// The columns of the candidates' rows (with them).
    pub(crate) layout: Option<UnionLayout>,
}

/// One finished trial of a workload: its config and its median time (`None`: it failed).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Observed {
    pub(crate) config: Point,
    pub(crate) time_us: Option<f64>,
}

/// The configs of a workload that have a task: those committed, and those proposed by the write
/// under way (never both: proposals skip what is taken).
#[derive(Clone, Copy)]
pub(crate) struct Taken<'a> {
    pub(crate) committed: &'a HashSet<Point>,
    pub(crate) pending: Option<&'a HashSet<Point>>,
}

impl Taken<'_> {
    /// Whether `config` has a task.
    pub(crate) fn contains(&self, config: Point) -> bool {
        self.committed.contains(&config) || self.pending.is_some_and(|p| p.contains(&config))
    }
}

/// A search strategy over one workload's valid configs.
pub(crate) trait Tuner: Send + Sync {
    /// Up to `n` config indices to measure next, none of which `taken` holds, given the outcomes
    /// so far in the order they finished (each of them a config in `taken`). Fewer than `n` only
    /// when the space has no more.
    fn propose(&self, observed: &[Observed], taken: &Taken<'_>, n: usize) -> Vec<Point>;

    /// The chance that a config it has not tried is >= 2% faster than the fastest observed, for
    /// tuners that model the space (`None` for the others, or before there is enough to say).
    fn chance(&self, _observed: &[Observed]) -> Option<f64> {
        None
    }

    /// Whether proposing is CPU work (a model fit) that belongs on a blocking thread.
    fn blocking(&self) -> bool {
        false
    }

    /// Does ahead of the first proposal what it would do first and what costs most (a model
    /// with transfer fits the prior's model), so that it happens outside the writer lock; the
    /// proposals are the same whether it ran or not. Blocking CPU work for a [`Tuner::blocking`]
    /// tuner.
    fn prepare(&self) {}
}

/// The random stream of workload `workload_idx` of a job seeded with `seed`: each workload of a
/// job gets its own order; mixing the index in keeps them apart.
fn stream(seed: u64, workload_idx: u32) -> u64 {
    seed ^ u64::from(workload_idx).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Measures configs in index order; with several templates, one of each in turn (so that a short
/// run sees every template, not only the first one's first configs).
struct Grid {
    order: Vec<Point>,
}

impl Grid {
    fn new(valid: &[Point]) -> Grid {
        let mut slots: Vec<Vec<Point>> = Vec::new();
        for p in valid {
            match slots.last_mut() {
                Some(run) if run[0].slot == p.slot => run.push(*p),
                _ => slots.push(vec![*p]),
            }
        }
        let longest = slots.iter().map(Vec::len).max().unwrap_or(0);
        let order = (0..longest).flat_map(|i| slots.iter().filter_map(move |run| run.get(i).copied())).collect();
        Grid { order }
    }
}

impl Tuner for Grid {
    fn propose(&self, _observed: &[Observed], taken: &Taken<'_>, n: usize) -> Vec<Point> {
        self.order.iter().copied().filter(|c| !taken.contains(*c)).take(n).collect()
    }
}

/// Measures configs in a seeded random order.
struct Random {
    /// The permutation, fixed by the seed. A named generator rather than `StdRng`, whose algorithm
    /// may change between rand releases; and since proposals skip what is taken, even a changed
    /// order would never repeat or lose a config.
    order: Vec<Point>,
}

impl Random {
    /// A shuffle of the whole union: each template's share of any prefix is its share of the
    /// space. (With one template, the same order as before spaces held several.)
    fn new(valid: &[Point], seed: u64, workload_idx: u32) -> Random {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(stream(seed, workload_idx));
        let mut order = valid.to_vec();
        order.shuffle(&mut rng);
        Random { order }
    }
}

impl Tuner for Random {
    fn propose(&self, _observed: &[Observed], taken: &Taken<'_>, n: usize) -> Vec<Point> {
        self.order.iter().copied().filter(|c| !taken.contains(*c)).take(n).collect()
    }
}

/// The search crate's model-guided tuner over a workload's candidates.
struct Model {
    /// Every valid config, ascending (so a config's position is a binary search away).
    valid: Arc<[Point]>,
    /// Their candidates (feature rows in the space's layout), in the same order.
    candidates: Arc<[Candidate]>,
    /// Behind a lock because proposing mutates it (it caches the prior's own model, fitted once);
    /// proposals of one workload are serialised by the tracker's writer lock anyway.
    inner: Mutex<ModelGuided>,
}

impl Model {
    fn position(&self, config: Point) -> Option<usize> {
        self.valid.binary_search(&config).ok()
    }
}

impl Tuner for Model {
    fn propose(&self, observed: &[Observed], taken: &Taken<'_>, n: usize) -> Vec<Point> {
        let observations: Vec<Observation> = observed
            .iter()
            .filter_map(|o| Some(Observation { pos: self.position(o.config)?, time_us: o.time_us }))
            .collect();
        // The configs in flight (taken, no outcome yet: the last of the batch before, or a batch
        // after a reused record or a restart): the model proposes around them.
        let done: HashSet<Point> = observed.iter().map(|o| o.config).collect();
        let mut in_flight: Vec<usize> = taken
            .committed
            .iter()
            .chain(taken.pending.into_iter().flatten())
            .filter(|c| !done.contains(c))
            .filter_map(|c| self.position(*c))
            .collect();
        in_flight.sort_unstable();
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner
            .propose_around(&self.candidates, &observations, &in_flight, n)
            .into_iter()
            .map(|pos| self.valid[pos])
            .filter(|c| !taken.contains(*c))
            .take(n)
            .collect()
    }

    fn blocking(&self) -> bool {
        true
    }

    fn prepare(&self) {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).prepare(&self.candidates);
    }

    fn chance(&self, observed: &[Observed]) -> Option<f64> {
        let observations: Vec<Observation> = observed
            .iter()
            .filter_map(|o| Some(Observation { pos: self.position(o.config)?, time_us: o.time_us }))
            .collect();
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).chance(&self.candidates, &observations)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space() -> WorkloadSpace {
        WorkloadSpace { valid: (0..200u64).map(|i| Point::new(0, i * 3)).collect(), candidates: None, layout: None }
    }

    fn propose(tuner: &dyn Tuner, taken: &HashSet<Point>, n: usize) -> Vec<Point> {
        tuner.propose(&[], &Taken { committed: taken, pending: None }, n)
    }

    #[test]
    fn grid_walks_in_index_order_skipping_taken() {
        let tuner = TunerKind::Grid.build(&space(), 1, 0, None).unwrap();
        let committed: HashSet<Point> = [Point::new(0, 0)].into();
        let pending: HashSet<Point> = [Point::new(0, 6)].into();
        let taken = Taken { committed: &committed, pending: Some(&pending) };
        assert_eq!(tuner.propose(&[], &taken, 3), [3, 9, 12].map(|i| Point::new(0, i)));
    }

    /// Two templates: slot 0 with 6 configs, slot 1 with 3.
    fn union() -> WorkloadSpace {
        let valid: Vec<Point> = (0..6).map(|i| Point::new(0, i * 2)).chain((0..3).map(|i| Point::new(1, i))).collect();
        WorkloadSpace { valid: valid.into(), candidates: None, layout: None }
    }

    #[test]
    fn grid_takes_the_templates_in_turns() {
        let tuner = TunerKind::Grid.build(&union(), 1, 0, None).unwrap();
        let p = Point::new;
        assert_eq!(
            propose(tuner.as_ref(), &HashSet::new(), 100),
            [p(0, 0), p(1, 0), p(0, 2), p(1, 1), p(0, 4), p(1, 2), p(0, 6), p(0, 8), p(0, 10)]
        );
        let taken: HashSet<Point> = [p(1, 0), p(0, 0)].into();
        assert_eq!(propose(tuner.as_ref(), &taken, 2), [p(0, 2), p(1, 1)]);
    }

    #[test]
    fn random_mixes_the_templates() {
        // Over seeds, the first few proposals come from both templates, not one first.
        let mut mixed = 0;
        for seed in 0..20 {
            let tuner = TunerKind::Random.build(&union(), seed, 0, None).unwrap();
            let all = propose(tuner.as_ref(), &HashSet::new(), 100);
            let mut sorted = all.clone();
            sorted.sort();
            assert_eq!(sorted, union().valid.to_vec());
            let first: HashSet<u32> = all[..4].iter().map(|p| p.slot).collect();
            mixed += usize::from(first.len() == 2);
        }
        assert!(mixed >= 15, "only {mixed} of 20 shuffles mixed both templates in their first 4");
    }

    #[test]
    fn random_is_a_seeded_permutation() {
        let build = |seed, idx| TunerKind::Random.build(&space(), seed, idx, None).unwrap();
        let none = HashSet::new();
        let all = propose(build(42, 0).as_ref(), &none, 1000);
        assert_eq!(all, propose(build(42, 0).as_ref(), &none, 1000));
        let mut sorted = all.clone();
        sorted.sort();
        assert_eq!(sorted, space().valid.to_vec());
        assert_ne!(all, space().valid.to_vec(), "a shuffle of 200 items left them in order");
        assert_ne!(all, propose(build(42, 1).as_ref(), &none, 1000));
        assert_ne!(all, propose(build(43, 0).as_ref(), &none, 1000));
    }

    #[test]
    fn proposals_continue_from_what_is_taken() {
        let tuner = TunerKind::Random.build(&space(), 7, 2, None).unwrap();
        let mut taken = HashSet::new();
        let mut seen = Vec::new();
        while taken.len() < 200 {
            let next = propose(tuner.as_ref(), &taken, 17);
            assert!(!next.is_empty());
            taken.extend(next.iter().copied());
            seen.extend(next);
        }
        // Proposing in batches gives the same order as proposing everything at once.
        assert_eq!(seen, propose(tuner.as_ref(), &HashSet::new(), 1000));
        assert!(propose(tuner.as_ref(), &taken, 5).is_empty());
        assert_eq!("grid".parse::<TunerKind>(), Ok(TunerKind::Grid));
        assert_eq!("model".parse::<TunerKind>(), Ok(TunerKind::Model));
        assert!("bayes".parse::<TunerKind>().unwrap_err().contains("known: random, grid, model"));
    }

    /// 512 candidates on three knobs of 8 values; the time is a bowl around (5, 2, 6).
    fn model_space() -> WorkloadSpace {
        let mut candidates = Vec::new();
        for a in 0..8usize {
            for b in 0..8usize {
                for c in 0..8usize {
                    candidates.push(Candidate {
                        index: (a * 64 + b * 8 + c) as u64 * 5,
                        features: vec![a as f64, b as f64, c as f64],
                        knobs: vec![a, b, c],
                        analytic_us: 1.0 + (a as f64 - 4.0).abs(),
                        group: 0,
                    });
                }
            }
        }
        let valid: Arc<[Point]> = candidates.iter().map(|c| Point::new(0, c.index)).collect();
        WorkloadSpace { valid, candidates: Some(candidates.into()), layout: None }
    }

    fn bowl(config: Point) -> f64 {
        let i = config.index / 5;
        let (a, b, c) = ((i / 64) as f64, ((i / 8) % 8) as f64, (i % 8) as f64);
        1.0 + ((a - 5.0).powi(2) + (b - 2.0).powi(2) + (c - 6.0).powi(2)) / 10.0
    }

    #[test]
    fn the_model_skips_configs_in_flight_and_is_deterministic() {
        assert!(TunerKind::Model.build(&space(), 1, 0, None).is_err(), "a model needs candidates");
        let run = || {
            let tuner = TunerKind::Model.build(&model_space(), 3, 1, None).unwrap();
            assert!(tuner.blocking());
            let mut committed = HashSet::new();
            let mut observed = Vec::new();
            // 4 in flight all along: each round proposes 4, and the 4 of the round before finish.
            let mut in_flight: Vec<Point> = Vec::new();
            let mut order = Vec::new();
            while observed.len() < 120 {
                let next = tuner.propose(&observed, &Taken { committed: &committed, pending: None }, 4);
                assert_eq!(next.len(), 4);
                for c in &next {
                    assert!(committed.insert(*c), "config {c:?} proposed twice");
                }
                for c in std::mem::replace(&mut in_flight, next.clone()) {
                    observed.push(Observed { config: c, time_us: Some(bowl(c)) });
                }
                order.extend(next);
            }
            order
        };
        let order = run();
        assert_eq!(order, run(), "same seed and outcomes, different proposals");
        // It learns the bowl: it reaches the bottom (one config of 512) within its first 64 trials,
        // where random search would take 256 on average and does so with a chance of 1 in 8.
        // (A share of every batch explores the knob values tried least, `least_tried`, so the
        // later trials are not all near the bottom once it is found.)
        let bottom = order.iter().position(|c| bowl(*c) <= 1.0 + 1e-9);
        assert!(bottom.is_some_and(|i| i < 64), "the bottom came at trial {bottom:?}");
    }
}

crate::store::text_column!(TunerKind {
    TunerKind::Random => "random",
    TunerKind::Grid => "grid",
    TunerKind::Model => "model",
});
