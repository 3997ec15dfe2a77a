//! Tuners: what to measure next. Each proposes positions into a workload's candidate list (its valid
//! configs) given every outcome so far; they are deterministic for a seed, so a tracker that
//! restarts rebuilds the same state from its records.
//!
//! - `random`: a seeded shuffle.
//! - `grid`: index order.
//! - `model`: gradient-boosted trees over config + workload features, refitted on every batch from
//!   this workload's outcomes plus, when given, other workloads' records (transfer). Before it has
//!   data it ranks by the template's analytic model. Each batch takes the best predictions with a
//!   diversity penalty for near-duplicates (configs one knob apart) and an exploration share drawn
//!   at random. When the candidate list is too large to score whole, an evolutionary search over
//!   knob mutations (guided by the same model) picks the pool the batch is drawn from.

use std::collections::HashSet;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{RngExt, SeedableRng};

use crate::Error;
use crate::model::{CostModel, normalise};

/// One config a tuner may propose.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// Index in the template's space.
    pub index: u64,
    /// Feature row (`features::row`).
    pub features: Vec<f64>,
    /// Position of each knob's value in its domain (for mutations and similarity).
    pub knobs: Vec<usize>,
    /// The template's analytic time estimate, microseconds (cold-start ranking).
    pub analytic_us: f64,
}

/// The outcome of one measured candidate: its median time, or `None` when it failed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Observation {
    /// Position in the candidate list.
    pub pos: usize,
    /// Median time in microseconds; `None` for a failed config.
    pub time_us: Option<f64>,
}

/// Training rows from other workloads on the same device class and template version.
#[derive(Clone, Debug, Default)]
pub struct Prior {
    /// Feature rows.
    pub rows: Vec<Vec<f64>>,
    /// Normalised log-times (`model::normalise`, per workload).
    pub y: Vec<f64>,
    /// The workload columns of each row's workload (`features::workload_row`), to weigh rows by
    /// how similar their workload is to the one being tuned.
    pub sources: Vec<[f64; 7]>,
}

/// How fast a prior workload's weight falls with its distance (in octaves of M, N and K, plus one
/// per differing type or layout) from the workload being tuned: two octaves away counts 1/e.
const SIMILARITY_SCALE: f64 = 2.0;

/// Similarity weight of a prior workload for the tuned one, from their workload columns.
pub fn similarity(a: &[f64; 7], b: &[f64]) -> f64 {
    let d: f64 = a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum();
    (-d / SIMILARITY_SCALE).exp()
}

impl Prior {
    /// Adds one workload's rows and raw outcomes; `source` is its workload columns.
    pub fn extend(&mut self, source: [f64; 7], rows: Vec<Vec<f64>>, times: &[Option<f64>]) {
        self.y.extend(normalise(times));
        self.sources.extend(std::iter::repeat_n(source, rows.len()));
        self.rows.extend(rows);
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// A search strategy.
pub trait Tuner: Send {
    /// Its name (`random`, `grid`, `model`).
    fn name(&self) -> &'static str;

    /// Up to `n` distinct positions of candidates not yet in `observed`.
    fn propose(&mut self, candidates: &[Candidate], observed: &[Observation], n: usize) -> Vec<usize>;
}

/// The tuners this build knows.
pub const NAMES: [&str; 3] = ["random", "grid", "model"];

/// The tuner called `name`, seeded.
pub fn by_name(name: &str, seed: u64, prior: Option<Arc<Prior>>) -> Result<Box<dyn Tuner>, Error> {
    match name {
        "random" => Ok(Box::new(Random { seed })),
        "grid" => Ok(Box::new(Grid)),
        "model" => Ok(Box::new(ModelGuided::new(seed, prior))),
        other => Err(Error::UnknownTuner(other.to_owned())),
    }
}

fn unmeasured(count: usize, observed: &[Observation]) -> Vec<bool> {
    let mut free = vec![true; count];
    for o in observed {
        if let Some(f) = free.get_mut(o.pos) {
            *f = false;
        }
    }
    free
}

/// A seeded permutation of the candidates, taken in order.
pub struct Random {
    seed: u64,
}

impl Tuner for Random {
    fn name(&self) -> &'static str {
        "random"
    }

    fn propose(&mut self, candidates: &[Candidate], observed: &[Observation], n: usize) -> Vec<usize> {
        let free = unmeasured(candidates.len(), observed);
        let mut order: Vec<usize> = (0..candidates.len()).collect();
        order.shuffle(&mut StdRng::seed_from_u64(self.seed));
        order.into_iter().filter(|p| free[*p]).take(n).collect()
    }
}

/// Candidates in index order.
pub struct Grid;

impl Tuner for Grid {
    fn name(&self) -> &'static str {
        "grid"
    }

    fn propose(&mut self, candidates: &[Candidate], observed: &[Observation], n: usize) -> Vec<usize> {
        let free = unmeasured(candidates.len(), observed);
        (0..candidates.len()).filter(|p| free[*p]).take(n).collect()
    }
}

/// Model-guided search with transfer, diversity and exploration.
pub struct ModelGuided {
    seed: u64,
    prior: Option<Arc<Prior>>,
    /// Share of every batch drawn at random from the unmeasured configs.
    pub exploration: f64,
    /// Outcomes of this workload needed before its own data trains the model (with a prior, the
    /// prior trains it from the start).
    pub min_observations: usize,
    /// Candidate lists longer than this are searched by evolution instead of scored whole.
    pub score_limit: usize,
    /// The prior alone, fitted once, to judge how well it predicts this workload.
    prior_model: std::cell::OnceCell<Option<CostModel>>,
}

/// How many of this workload's own measurements the whole prior is worth, at full trust: enough to
/// steer the first batches, few enough that the workload's own data soon outweighs it.
const PRIOR_OBSERVATIONS: f64 = 64.0;

/// Spearman rank correlation of two equally long series (0 when either is constant).
fn spearman(a: &[f64], b: &[f64]) -> f64 {
    fn ranks(v: &[f64]) -> Vec<f64> {
        let mut order: Vec<usize> = (0..v.len()).collect();
        order.sort_by(|x, y| v[*x].total_cmp(&v[*y]));
        let mut r = vec![0.0; v.len()];
        for (rank, i) in order.into_iter().enumerate() {
            r[i] = rank as f64;
        }
        r
    }
    let (ra, rb) = (ranks(a), ranks(b));
    let n = ra.len() as f64;
    let mean = (n - 1.0) / 2.0;
    let cov: f64 = ra.iter().zip(&rb).map(|(x, y)| (x - mean) * (y - mean)).sum();
    let var: f64 = ra.iter().map(|x| (x - mean).powi(2)).sum();
    if var == 0.0 { 0.0 } else { cov / var }
}

impl ModelGuided {
    /// A tuner with the default exploration (10%) and warm-up (8 outcomes).
    pub fn new(seed: u64, prior: Option<Arc<Prior>>) -> ModelGuided {
        ModelGuided {
            seed,
            prior: prior.filter(|p| !p.is_empty()),
            exploration: 0.1,
            min_observations: 8,
            score_limit: 20_000,
            prior_model: std::cell::OnceCell::new(),
        }
    }

    /// How far the prior deserves trust on this workload: the rank correlation between what a
    /// model of the prior alone predicts for this workload's measured configs and what they
    /// measured (clamped to 0..=1); 1 before there is enough to judge.
    fn prior_agreement(&self, candidates: &[Candidate], observed: &[Observation]) -> f64 {
        let Some(prior) = &self.prior else { return 0.0 };
        let ok: Vec<&Observation> = observed.iter().filter(|o| o.time_us.is_some()).collect();
        if ok.len() < self.min_observations {
            return 1.0;
        }
        let model = self.prior_model.get_or_init(|| {
            let width = candidates.first().map_or(0, |c| c.features.len());
            let here = &candidates.first().map_or(&[][..], |c| &c.features[width.saturating_sub(7)..]);
            let weights: Vec<f64> = prior.sources.iter().map(|s| similarity(s, here).max(1e-6)).collect();
            CostModel::fit(&prior.rows, &prior.y, &weights, self.seed).ok()
        });
        let Some(model) = model else { return 0.0 };
        let predicted = model.predict(&ok.iter().map(|o| candidates[o.pos].features.clone()).collect::<Vec<_>>());
        let measured: Vec<f64> = ok.iter().map(|o| o.time_us.unwrap_or(f64::INFINITY)).collect();
        spearman(&predicted, &measured).clamp(0.0, 1.0)
    }

    /// Predicted normalised log-times of `positions` (lower is better), or the analytic estimates
    /// when there is nothing to learn from yet.
    fn scores(&self, candidates: &[Candidate], observed: &[Observation], positions: &[usize], seed: u64) -> Vec<f64> {
        let own = observed.len() >= self.min_observations;
        if !own && self.prior.is_none() {
            return positions.iter().map(|p| candidates[*p].analytic_us.ln()).collect();
        }
        let mut rows = Vec::new();
        let mut y = Vec::new();
        let mut weights = Vec::new();
        if let Some(prior) = &self.prior {
            // The prior counts as PRIOR_OBSERVATIONS measurements of this workload, scaled by how
            // well it has predicted this workload so far.
            // Each prior row is further weighed by how similar its workload is to this one: a
            // model fitted on small shapes knows little about a large one.
            let trust = self.prior_agreement(candidates, observed);
            let width = candidates.first().map_or(0, |c| c.features.len());
            let here = &candidates.first().map_or(&[][..], |c| &c.features[width.saturating_sub(7)..]);
            if trust > 0.0 && here.len() == 7 {
                let w = PRIOR_OBSERVATIONS * trust / prior.rows.len() as f64;
                for ((row, target), source) in prior.rows.iter().zip(&prior.y).zip(&prior.sources) {
                    let sim = similarity(source, here);
                    if sim > 1e-3 {
                        rows.push(row.clone());
                        y.push(*target);
                        weights.push(w * sim);
                    }
                }
            }
        }
        // A prior of dissimilar workloads is worth less than a few measurements: without data of
        // its own, the tuner then ranks by the analytic model instead.
        if !own && weights.iter().sum::<f64>() < PRIOR_OBSERVATIONS / 16.0 {
            return positions.iter().map(|p| candidates[*p].analytic_us.ln()).collect();
        }
        if !observed.is_empty() {
            let times: Vec<Option<f64>> = observed.iter().map(|o| o.time_us).collect();
            y.extend(normalise(&times));
            rows.extend(observed.iter().map(|o| candidates[o.pos].features.clone()));
            weights.extend(std::iter::repeat_n(1.0, observed.len()));
        }
        if rows.is_empty() {
            return positions.iter().map(|p| candidates[*p].analytic_us.ln()).collect();
        }
        let analytic: Vec<f64> = positions.iter().map(|p| candidates[*p].analytic_us.ln()).collect();
        let Ok(model) = CostModel::fit(&rows, &y, &weights, seed) else { return analytic };
        let learned = model.predict(&positions.iter().map(|p| candidates[*p].features.clone()).collect::<Vec<_>>());
        if own {
            return learned;
        }
        // Before this workload has data of its own, nothing says whether the prior (other shapes)
        // or the analytic model (this shape, crudely) ranks it better: take turns between them,
        // scoring each config by its better rank of the two (in the learned model's units, which
        // the diversity penalty is scaled to).
        let mut sorted = learned.clone();
        sorted.sort_by(f64::total_cmp);
        ranks(&analytic).iter().zip(&learned).map(|(rank, own)| own.min(sorted[*rank])).collect()
    }

    /// The pool a batch is chosen from: every unmeasured candidate, or for very large lists the
    /// survivors of an evolutionary search (mutating one knob at a time) under the model.
    fn pool(&self, candidates: &[Candidate], free: &[bool], rng: &mut StdRng, n: usize) -> Vec<usize> {
        let all: Vec<usize> = (0..candidates.len()).filter(|p| free[*p]).collect();
        if all.len() <= self.score_limit {
            return all;
        }
        // Large lists: start from a random sample, then repeatedly add knob-neighbours of the
        // current pool; the model then ranks the pool.
        let by_knobs: std::collections::HashMap<&[usize], usize> =
            candidates.iter().enumerate().map(|(p, c)| (c.knobs.as_slice(), p)).collect();
        let mut pool: HashSet<usize> = all.sample(rng, (self.score_limit / 4).max(n)).copied().collect();
        for _ in 0..3 {
            let parents: Vec<usize> = pool.iter().copied().collect();
            for p in parents {
                let mut knobs = candidates[p].knobs.clone();
                let k = rng.random_range(0..knobs.len());
                knobs[k] = if rng.random_bool(0.5) { knobs[k] + 1 } else { knobs[k].saturating_sub(1) };
                if let Some(&q) = by_knobs.get(knobs.as_slice())
                    && free[q]
                {
                    pool.insert(q);
                }
            }
        }
        let mut pool: Vec<usize> = pool.into_iter().collect();
        pool.sort_unstable();
        pool
    }
}

/// The rank of each value (0 for the lowest; ties in index order).
fn ranks(values: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|a, b| values[*a].total_cmp(&values[*b]).then(a.cmp(b)));
    let mut out = vec![0; values.len()];
    for (rank, i) in order.into_iter().enumerate() {
        out[i] = rank;
    }
    out
}

/// Knob positions differing in at most one knob.
fn neighbours(a: &[usize], b: &[usize]) -> bool {
    a.iter().zip(b).filter(|(x, y)| x != y).count() <= 1
}

impl Tuner for ModelGuided {
    fn name(&self) -> &'static str {
        "model"
    }

    fn propose(&mut self, candidates: &[Candidate], observed: &[Observation], n: usize) -> Vec<usize> {
        let free = unmeasured(candidates.len(), observed);
        // The batch depends only on the seed and what has been observed, so a restarted tracker
        // proposes the same batch again.
        let round_seed = self.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(observed.len() as u64);
        let mut rng = StdRng::seed_from_u64(round_seed);
        let pool = self.pool(candidates, &free, &mut rng, n);
        if pool.is_empty() || n == 0 {
            return Vec::new();
        }
        let scores = self.scores(candidates, observed, &pool, round_seed);
        // Exploration guards a trained model against its own bias; before this workload's data
        // trains one, every pick is a guess anyway.
        let trained = observed.len() >= self.min_observations;
        let share = if trained { self.exploration } else { 0.0 };
        let explore = ((n as f64 * share).round() as usize).min(n.saturating_sub(1));
        let exploit = n - explore;

        // Greedy selection: best predicted first, each pick making its knob-neighbours look worse,
        // so one batch does not spend itself on near-copies of one config.
        let spread = {
            let mut s = scores.clone();
            s.sort_by(f64::total_cmp);
            (s[s.len() * 3 / 4] - s[s.len() / 4]).abs().max(1e-3)
        };
        let mut order: Vec<usize> = (0..pool.len()).collect();
        order.sort_by(|a, b| scores[*a].total_cmp(&scores[*b]));
        let shortlist: Vec<usize> = order.into_iter().take((exploit * 8).max(exploit)).collect();
        let mut penalty = vec![0.0f64; pool.len()];
        let mut chosen: Vec<usize> = Vec::with_capacity(n);
        let mut taken: HashSet<usize> = HashSet::new();
        while chosen.len() < exploit {
            let Some(&best) = shortlist
                .iter()
                .filter(|i| !taken.contains(*i))
                .min_by(|a, b| (scores[**a] + penalty[**a]).total_cmp(&(scores[**b] + penalty[**b])))
            else {
                break;
            };
            taken.insert(best);
            chosen.push(pool[best]);
            for &i in &shortlist {
                if neighbours(&candidates[pool[i]].knobs, &candidates[pool[best]].knobs) {
                    penalty[i] += 0.5 * spread;
                }
            }
        }
        let rest: Vec<usize> = (0..pool.len()).filter(|i| !taken.contains(i)).collect();
        chosen.extend(rest.sample(&mut rng, n - chosen.len()).map(|i| pool[*i]));
        chosen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A synthetic space: 3 knobs of 8 values whose time (`time`) is a bowl around (5, 2, 6).
    fn space() -> Vec<Candidate> {
        let mut out = Vec::new();
        for a in 0..8 {
            for b in 0..8 {
                for c in 0..8 {
                    out.push(Candidate {
                        index: (a * 64 + b * 8 + c) as u64,
                        features: vec![a as f64, b as f64, c as f64],
                        knobs: vec![a, b, c],
                        analytic_us: 1.0 + (a as f64 - 4.0).abs(),
                    });
                }
            }
        }
        out
    }

    fn time(c: &Candidate) -> f64 {
        let f = &c.features;
        1.0 + ((f[0] - 5.0).powi(2) + (f[1] - 2.0).powi(2) + (f[2] - 6.0).powi(2)) / 10.0
    }

    fn run(tuner: &mut dyn Tuner, budget: usize) -> (Vec<Observation>, usize) {
        let cands = space();
        let mut observed = Vec::new();
        let mut found_at = usize::MAX;
        while observed.len() < budget {
            let batch = tuner.propose(&cands, &observed, 8);
            assert!(!batch.is_empty());
            let mut seen: HashSet<usize> = observed.iter().map(|o: &Observation| o.pos).collect();
            for p in batch {
                assert!(seen.insert(p), "proposed {p} twice");
                observed.push(Observation { pos: p, time_us: Some(time(&cands[p])) });
                if time(&cands[p]) <= 1.0 && found_at == usize::MAX {
                    found_at = observed.len();
                }
            }
        }
        (observed, found_at)
    }

    #[test]
    fn proposals_are_new_and_deterministic() {
        for name in NAMES {
            let mut a = by_name(name, 3, None).unwrap();
            let mut b = by_name(name, 3, None).unwrap();
            let (oa, _) = run(a.as_mut(), 40);
            let (ob, _) = run(b.as_mut(), 40);
            assert_eq!(oa, ob, "{name} is not deterministic");
        }
        assert!(by_name("annealing", 1, None).is_err());
    }

    #[test]
    fn the_model_finds_the_optimum_faster_than_random() {
        let mut model_trials = Vec::new();
        let mut random_trials = Vec::new();
        for seed in 0..5 {
            model_trials.push(run(by_name("model", seed, None).unwrap().as_mut(), 512).1);
            random_trials.push(run(by_name("random", seed, None).unwrap().as_mut(), 512).1);
        }
        model_trials.sort();
        random_trials.sort();
        assert!(model_trials[2] * 3 < random_trials[2], "model {model_trials:?} vs random {random_trials:?}");
    }

    #[test]
    fn exhausts_the_space_without_repeats() {
        let (observed, _) = run(by_name("model", 9, None).unwrap().as_mut(), 512);
        let distinct: HashSet<usize> = observed.iter().map(|o| o.pos).collect();
        assert_eq!(distinct.len(), 512);
    }
}
