//! Tuners: what to measure next. Each proposes positions into a workload's candidate list (its valid
//! configs) given every outcome so far; they are deterministic for a seed, so a tracker that
//! restarts rebuilds the same state from its records.
//!
//! - `random`: a seeded shuffle.
//! - `grid`: index order.
//! - `model`: gradient-boosted trees over config + workload features, refitted on every batch from
//!   this workload's outcomes plus, when given, other workloads' records (transfer). Before it has
//!   data it ranks by the template's analytic model. Each batch takes the best predictions with a
//!   diversity penalty for near-duplicates (configs one knob apart) and an exploration share of
//!   the configs whose knob values it has tried least (`least_tried`); once a batch of trials has
//!   found nothing faster, half of the greedy picks are local moves, configs a knob or two from
//!   the fastest measured (`local_moves`). When the candidate list is too large to score whole,
//!   an evolutionary search over knob mutations (guided by the same model) picks the pool the
//!   batch is drawn from.

use std::collections::HashSet;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{RngExt, SeedableRng};

use crate::Error;
use crate::model::{CostModel, normalise, normalise_transfer};

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
    /// The template's position in a space that holds several (0 in a space of one). Two
    /// templates' analytic models were never calibrated against each other, so a cold start
    /// without a prior gives each template a share of its first batch.
    pub group: usize,
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
#[derive(Default)]
pub struct Prior {
    /// Feature rows.
    pub rows: Vec<Vec<f64>>,
    /// Capped log-times relative to each workload's best (`model::normalise_transfer`).
    pub y: Vec<f64>,
    /// The workload columns of each row's workload (`features::workload_row`), to weigh rows by
    /// how similar their workload is to the one being tuned.
    pub sources: Vec<[f64; 7]>,
    /// Models of the prior fitted for a tuned workload (keyed by its workload columns): fitted
    /// once and shared by every tuner of that workload.
    fitted: std::sync::Mutex<Vec<FittedPrior>>,
}

/// A prior's model for one workload (its workload columns' bits), or `None` when none is worth it.
type FittedPrior = ([u64; 7], Option<Arc<CostModel>>);

impl std::fmt::Debug for Prior {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prior").field("rows", &self.rows.len()).finish_non_exhaustive()
    }
}

impl Clone for Prior {
    fn clone(&self) -> Prior {
        Prior { rows: self.rows.clone(), y: self.y.clone(), sources: self.sources.clone(), fitted: Default::default() }
    }
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
        self.y.extend(normalise_transfer(times));
        self.sources.extend(std::iter::repeat_n(source, rows.len()));
        self.rows.extend(rows);
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The prior's model for a workload whose workload columns are `here`: fitted on the rows
    /// [`Prior::selection`] picks, each weighed by how similar its workload is (`similarity`);
    /// `None` when nothing similar enough is in the prior or the fit fails. Fitted once per
    /// workload and cached.
    pub fn model_for(&self, here: &[f64; 7], seed: u64) -> Option<Arc<CostModel>> {
        let key = here.map(f64::to_bits);
        let mut fitted = self.fitted.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, m)) = fitted.iter().find(|(k, _)| *k == key) {
            return m.clone();
        }
        let picked = self.selection(here);
        // Each workload that trains the model counted once, by how similar it is.
        let mut workloads: Vec<[u64; 7]> = picked.iter().map(|&i| self.sources[i].map(f64::to_bits)).collect();
        workloads.sort_unstable();
        workloads.dedup();
        let similar: f64 = workloads.iter().map(|w| similarity(&w.map(f64::from_bits), here)).sum();
        let model = (similar >= MIN_PRIOR_SIMILARITY)
            .then(|| {
                let rows: Vec<Vec<f64>> = picked.iter().map(|&i| self.rows[i].clone()).collect();
                let y: Vec<f64> = picked.iter().map(|&i| self.y[i]).collect();
                let weights: Vec<f64> = picked.iter().map(|&i| similarity(&self.sources[i], here)).collect();
                CostModel::fit(&rows, &y, &weights, seed).ok().map(Arc::new)
            })
            .flatten();
        fitted.push((key, model.clone()));
        model
    }

    /// The rows (positions, ascending) that train the model for a workload whose columns are
    /// `here`: those of the [`PRIOR_WORKLOADS`] workloads most similar to it (`nearest`), at most
    /// [`PRIOR_ROWS_PER_WORKLOAD`] of each (`capped`). The tracker featurizes only these (a new
    /// database's packs hold about 50 workloads and 120,000 records of today's templates), so a
    /// prior's cost stops growing with the store.
    pub fn selection(&self, here: &[f64; 7]) -> Vec<usize> {
        self.selection_of(here, PRIOR_WORKLOADS, PRIOR_ROWS_PER_WORKLOAD)
    }

    /// [`Prior::selection`] with `workloads` nearest workloads and at most `rows` rows of each.
    pub fn selection_of(&self, here: &[f64; 7], workloads: usize, rows: usize) -> Vec<usize> {
        let mut groups: Vec<([u64; 7], Vec<usize>)> = Vec::new();
        for (i, s) in self.sources.iter().enumerate() {
            let key = s.map(f64::to_bits);
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, rows)) => rows.push(i),
                None => groups.push((key, vec![i])),
            }
        }
        let sources: Vec<[f64; 7]> = groups.iter().map(|(k, _)| k.map(f64::from_bits)).collect();
        let mut out: Vec<usize> = Vec::new();
        for g in nearest(&sources, &[*here], workloads) {
            let members = &groups[g].1;
            let y: Vec<f64> = members.iter().map(|&i| self.y[i]).collect();
            out.extend(capped(&y, rows).into_iter().map(|j| members[j]));
        }
        out.sort_unstable();
        out
    }
}

/// Most workloads of a prior that train its model for one tuned workload: the most similar. A
/// bound on the prior's cost as the store grows, above every ground-truth file's count (32 in the
/// first sweeps, 15 + 8 in today's), so no bar's training set is cut: 16 cost the held-out
/// m768n3072k768 tt of the first sweeps its 2x gain (0.81x, CI of 2026-11-28), and dropping even
/// one of 7 conv layers cost a strided conv of the training split 41 trials to 5% instead of 19.
pub const PRIOR_WORKLOADS: usize = 64;

/// Most rows of one prior workload that train the model (see [`capped`]): above every shipped
/// workload's count (today's sweeps 3,000, the exhaustive ones up to about 9,300), a bound for
/// larger stores. A cap of 1,200 cost the strided conv above 75 trials to 5% instead of 19.
pub const PRIOR_ROWS_PER_WORKLOAD: usize = 20_000;

/// Positions into `sources` (workload columns) of the `k` most similar to each of `targets`
/// (by [`similarity`]; ties to the earlier), ascending, each once: the workloads of a prior that
/// may train a model for any of `targets`.
pub fn nearest(sources: &[[f64; 7]], targets: &[[f64; 7]], k: usize) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::new();
    for t in targets {
        let mut order: Vec<usize> = (0..sources.len()).collect();
        order.sort_by(|a, b| similarity(t, &sources[*b]).total_cmp(&similarity(t, &sources[*a])).then(a.cmp(b)));
        out.extend(order.into_iter().take(k));
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Which workloads of a prior may train a model for a space of several templates, given which of
/// the space's templates each workload has records of (`holds[w][t]`): a workload is left out when
/// another was measured with more of the space (every template it has, and one it lacks). The
/// tracker (`tracker/src/search.rs`) and the replay ([`crate::replay`]) both build their priors
/// through it.
///
/// Why: a workload's transfer targets are its times over its own best
/// ([`crate::model::normalise_transfer`]), and its best is taken over the templates it was
/// measured with. One measured with part of the space has its best on another scale: the older
/// sweeps' workloads, of `wmma_gemm` alone (their `wgmma_gemm` v2 records no longer hold), call
/// their fastest `wmma_gemm` configs best (target 0) where the union-v14 matmuls, measured with
/// both, put those configs 4-5x behind `wgmma_gemm`'s (capped, twice as slow), so the two kinds of
/// workload teach the model opposite things. Nothing of such a workload is kept: its rows of the
/// templates it has are relative to the same partial best. Where no workload has more than
/// another (one of `wmma_gemm` alone beside one of `wgmma_gemm` alone, or a store of one
/// template's records), every one is kept: none is known to be on the space's scale, and a prior
/// of partial workloads still warms the search better than none. The cost: a workload measured
/// with one template (a job that named it) is left out of a union's prior even when that template
/// wins there; a job of that template alone still reads it. Made for the union-v14 training split
/// with every shipped file as the prior (a fresh tracker's): its dilated conv n4h32w32c96 went from
/// 107 trials to 2% to 85, and the cold start's prior is now the union-v14 files' (docs/
/// BENCHMARKS.md, "Search"). On the first sweeps' union matmuls (wgmma_gemm v2,
/// `shipped_replay.rs`), whose priors lost the 16 wmma-only matmuls, m1536n1536k3072 tt went
/// from 10 trials to 2% to 87 and m2048n2048k2048 nn from 9 to 4 (20 seeds; since `wgmma_gemm`'s
/// `fill_share` column, 10 and 6).
pub fn covering(holds: &[Vec<bool>]) -> Vec<bool> {
    // Whether `a` has every template of `b` and one more.
    let more = |a: &[bool], b: &[bool]| {
        let width = a.len().max(b.len());
        let has = |x: &[bool], t: usize| x.get(t) == Some(&true);
        (0..width).all(|t| has(a, t) || !has(b, t)) && (0..width).any(|t| has(a, t) && !has(b, t))
    };
    let mut kinds: Vec<&Vec<bool>> = holds.iter().collect();
    kinds.sort();
    kinds.dedup();
    holds.iter().map(|h| !kinds.iter().any(|k| more(k, h))).collect()
}

/// Positions (ascending) of at most `cap` of one workload's rows, given their transfer targets
/// `y` (`model::normalise_transfer`; lower is faster): the fastest half of the cap, then an even
/// spread over the rest, so the model sees both what is near the best and the shape of the
/// whole space. Ties by position, so the choice depends on the values alone.
pub fn capped(y: &[f64], cap: usize) -> Vec<usize> {
    if y.len() <= cap {
        return (0..y.len()).collect();
    }
    let mut order: Vec<usize> = (0..y.len()).collect();
    order.sort_by(|a, b| y[*a].total_cmp(&y[*b]).then(a.cmp(b)));
    let best = cap / 2;
    let rest = &order[best..];
    let spread = cap - best;
    let mut out: Vec<usize> = order[..best].to_vec();
    out.extend((0..spread).map(|i| rest[i * rest.len() / spread]));
    out.sort_unstable();
    out
}

/// A prior whose workloads are, summed, less similar to the tuned one than one workload about
/// five octaves of M, N and K away is not worth a model: the tuner then starts from the analytic
/// model. (The threshold of the earlier weighted-refit tuner, whose prior then weighed less than
/// a sixteenth of the 64 measurements it was worth.)
const MIN_PRIOR_SIMILARITY: f64 = 1.0 / 16.0;

/// Picks of a first batch with a prior that follow the prior's model for each one that follows
/// the analytic model (whose estimates were never calibrated across the templates of a union:
/// on the union-v14 matmuls half of a first batch went to `wmma_gemm` configs 4-5x slower than the
/// best). Chosen on the training split of the union-v14 replay (docs/BENCHMARKS.md, "Search"),
/// 20 seeds: 1 (turn about) gave median trials to 2% of 11 (matmul) and 14 (conv); 2 gave 10 and
/// 11; 3 gave 9 and 10 but the dilated conv 97 trials to 2% (85 with 2); the prior alone 6 and 6,
/// but the dilated conv not within 2% by 300 trials and m2560n768k3072 twice as slow.
const PRIOR_TURNS: usize = 2;

/// A search strategy.
pub trait Tuner: Send {
    /// Its name (`random`, `grid`, `model`).
    fn name(&self) -> &'static str;

    /// Up to `n` distinct positions of candidates not yet in `observed`.
    fn propose(&mut self, candidates: &[Candidate], observed: &[Observation], n: usize) -> Vec<usize>;

    /// As [`Tuner::propose`] while the configs at `pending` (proposed, not yet measured) are
    /// measured: none of them again. The tracker asks this way for the next batch while the last
    /// few of the one before still measure ([`lookahead`]), and after a reused record or a restart.
    fn propose_around(
        &mut self,
        candidates: &[Candidate],
        observed: &[Observation],
        pending: &[usize],
        n: usize,
    ) -> Vec<usize> {
        let wanted = n.saturating_add(pending.len());
        self.propose(candidates, observed, wanted).into_iter().filter(|p| !pending.contains(p)).take(n).collect()
    }
}

/// How many configs of a batch may still be measuring when a batch tuner is asked for the next
/// batch: the tracker proposes batch k + 1 once no more than this many of batch k (and before) are
/// outstanding, so that the worker compiles it while the last of batch k measure, and the replay
/// ([`crate::replay`]) walks the same way. 0 would be whole batches, each once the last is in:
/// the worker's compile pool then waits for every fit and the measure stage for the first compile
/// of every batch (about 0.4 s a batch of 16 on an H200, 2026-11-28). How far ahead, in eighths of
/// a batch, was chosen on the training split of the union-v14 replay (docs/BENCHMARKS.md,
/// "Search"), 20 seeds, batches of 16: a whole batch (batch k + 2 chosen knowing batches 1..=k)
/// and half a batch each took the strided conv n12 28x28 256->256 3x3 below its 2x gain (1.6x in
/// an earlier space, 1.0x: 81 trials to 5%, as many as random); a quarter keeps it at 2.7x.
pub fn lookahead(batch: usize) -> usize {
    batch * LOOKAHEAD_EIGHTHS / 8
}

/// [`lookahead`] in eighths of a batch: a quarter (4 of 16).
const LOOKAHEAD_EIGHTHS: usize = 2;

/// The tuners this build knows.
pub const NAMES: [&str; 4] = ["random", "grid", "model", "autotvm"];

/// The tuner called `name`, seeded.
pub fn by_name(name: &str, seed: u64, prior: Option<Arc<Prior>>) -> Result<Box<dyn Tuner>, Error> {
    match name {
        "random" => Ok(Box::new(Random { seed })),
        "grid" => Ok(Box::new(Grid)),
        "model" => Ok(Box::new(ModelGuided::new(seed, prior))),
        "autotvm" => Ok(Box::new(Annealing::new(seed))),
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
    /// Share of every batch (once this workload's data trains the model) given to the unmeasured
    /// configs whose knob values have been tried least (`least_tried`). 20% (3 of 16), with
    /// those picks, was chosen on the training split of the union-v14 replay (docs/BENCHMARKS.md,
    /// "Search"): 10% drawn at random left the dilated conv 301 trials from 2%; 10% least-tried
    /// 103; 20% 84; 30% see there. An exploration share in the first batch too (25%) cost a 1x1
    /// conv 14 -> 38 trials to 2% and was left out.
    pub exploration: f64,
    /// Outcomes of this workload needed before its own data trains the model (with a prior, the
    /// prior trains it from the start).
    pub min_observations: usize,
    /// Candidate lists longer than this are searched by evolution instead of scored whole.
    pub score_limit: usize,
    /// The prior model's prediction for every candidate (computed on first use).
    prior_scores: std::cell::OnceCell<Option<Vec<f64>>>,
}

impl ModelGuided {
    /// How sure it is that the search is done: [`chance_of_better`] with this tuner's prior.
    pub fn chance(&self, candidates: &[Candidate], observed: &[Observation]) -> Option<f64> {
        chance_of_better(candidates, observed, self.prior.as_deref(), self.seed)
    }

    /// A tuner with the default exploration (20%) and warm-up (8 outcomes).
    pub fn new(seed: u64, prior: Option<Arc<Prior>>) -> ModelGuided {
        ModelGuided {
            seed,
            prior: prior.filter(|p| !p.is_empty()),
            exploration: 0.2,
            min_observations: 8,
            score_limit: 20_000,
            prior_scores: std::cell::OnceCell::new(),
        }
    }

    /// Fits the prior's model for `candidates` and scores them (what the first proposal would
    /// do), so that a caller can do this costly part where it blocks nothing (the tracker does it
    /// outside its write lock). The result is the same whenever it is computed.
    pub fn prepare(&self, candidates: &[Candidate]) {
        self.prior_scores(candidates);
    }

    /// What the prior's model predicts for each candidate, or `None` without a usable prior.
    fn prior_scores(&self, candidates: &[Candidate]) -> Option<&Vec<f64>> {
        self.prior_scores
            .get_or_init(|| {
                let prior = self.prior.as_ref()?;
                let model = prior.model_for(&workload_columns(candidates)?, self.seed)?;
                Some(model.predict(&candidates.iter().map(|c| c.features.clone()).collect::<Vec<_>>()))
            })
            .as_ref()
    }

    /// Predicted normalised log-times of `positions` (lower is better). Before this workload has
    /// data of its own: the prior's model, or the analytic estimates without one. After, with a
    /// prior: the prior's prediction plus a model of where this workload's outcomes depart from it
    /// ([`PriorOffset`]); without one, a model of this workload's outcomes alone.
    fn scores(&self, candidates: &[Candidate], observed: &[Observation], positions: &[usize], seed: u64) -> Vec<f64> {
        let own = observed.len() >= self.min_observations;
        let prior = self.prior_scores(candidates);
        let analytic = || positions.iter().map(|p| candidates[*p].analytic_us.ln()).collect::<Vec<_>>();
        let row = |p: usize| {
            let mut r = candidates[p].features.clone();
            if let Some(prior) = prior {
                r.push(prior[p]);
            }
            r
        };
        if !own {
            let Some(prior) = prior else { return analytic() };
            // Before this workload has data of its own, nothing says whether the prior (other
            // shapes) or the analytic model (this shape, crudely) ranks it better: take turns
            // between them, [`PRIOR_TURNS`] of the prior's picks to one of the analytic model's,
            // scoring each config by its better rank of the two (the analytic rank r counting as
            // the prior's rank `PRIOR_TURNS * r`; in the prior's units, which the diversity
            // penalty is scaled to).
            let learned: Vec<f64> = positions.iter().map(|p| prior[*p]).collect();
            let mut sorted = learned.clone();
            sorted.sort_by(f64::total_cmp);
            let last = sorted.len() - 1;
            return ranks(&analytic())
                .iter()
                .zip(&learned)
                .map(|(rank, own)| own.min(sorted[(rank * PRIOR_TURNS).min(last)]))
                .collect();
        }
        let times: Vec<Option<f64>> = observed.iter().map(|o| o.time_us).collect();
        // Beside the prior's column, this workload's targets are in the prior's units.
        let y = if prior.is_some() { normalise_transfer(&times) } else { normalise(&times) };
        let rows: Vec<Vec<f64>> = observed.iter().map(|o| row(o.pos)).collect();
        let query: Vec<Vec<f64>> = positions.iter().map(|p| row(*p)).collect();
        if let Some(prior) = prior {
            // Where the prior may mislead, a single model follows it; an ensemble's spread shows
            // where its members disagree, and the lower bound sends part of each batch there.
            let offset = PriorOffset(prior);
            let (mean, sd) = ensemble(&rows, &offset.residuals(observed, &y), &query, seed);
            return offset.add(positions, &mean).iter().zip(&sd).map(|(m, s)| m - s).collect();
        }
        let Ok(model) = CostModel::fit(&rows, &y, &vec![1.0; rows.len()], seed) else { return analytic() };
        model.predict(&query)
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

/// The prior's prediction as the base of a workload's own model (its offset, as a base margin in
/// gradient boosting): the trees fit what this workload's outcomes add to the prior (outcome minus
/// prediction), and a config's score is the prior's prediction plus theirs. The prediction is also
/// a column of the rows, so the trees can say where the prior holds and where it does not.
///
/// Why: with the prior as a column only, the trees had to rebuild its ranking from the workload's
/// own 12-60 outcomes, which cut the column into a few bins; within a bin every unmeasured config
/// scored alike, and the rest of the features (split on a dozen rows) ordered the thousands of
/// them. The prior's fine ranking, the one thing it knew about configs not near any measured one,
/// was lost after the first batch: on union-v19's conv n2h28w28c384 the first trained batch
/// (after 192x64 tiles at 1.08x) went to 224- and 256-row tiles in clusters of 2 at 1.4-2.1x.
/// With the offset, where the workload's outcomes agree with the prior the prior's order stands,
/// and where they do not the trees move whole regions. Made on the development splits of the
/// union-v19 and union-v14 replays (docs/BENCHMARKS.md, "Search"), no constant: with
/// `wgmma_conv2d`'s work columns ([`crate::features::WGMMA_WORK_FEATURES`]) it took union-v19
/// conv's dev median trials to 2% from 51 to 12, union-v14 conv's from 11 to 5; alone, on the
/// matmuls, union-v19's dev m384n12288k768 from 55 to 22, m3584n896k2560 73 -> 50, m8192n2048k2048
/// 72 -> 55 (dev median 11 either way), union-v14's m512n8192k1024 23 -> 34 (median 6).
struct PriorOffset<'a>(&'a [f64]);

impl PriorOffset<'_> {
    /// Targets of the workload's own model: each outcome's target less the prior's prediction.
    fn residuals(&self, observed: &[Observation], y: &[f64]) -> Vec<f64> {
        y.iter().zip(observed).map(|(y, o)| y - self.0[o.pos]).collect()
    }

    /// Scores of `positions` from the own model's predictions for them: the prior's plus theirs.
    fn add(&self, positions: &[usize], own: &[f64]) -> Vec<f64> {
        positions.iter().zip(own).map(|(p, m)| self.0[*p] + m).collect()
    }
}

/// How sure the search is that it is done: the model's chance that some config not yet measured
/// is at least 2% faster than the fastest measured, from a bootstrap ensemble fitted on the
/// workload's outcomes (with the prior's prediction as a column when there is a prior): each
/// untried config's chance under a normal error with the ensemble's spread; the largest of them.
/// `None` before `MIN_FOR_CHANCE` ok outcomes.
pub fn chance_of_better(
    candidates: &[Candidate],
    observed: &[Observation],
    prior: Option<&Prior>,
    seed: u64,
) -> Option<f64> {
    if observed.iter().filter(|o| o.time_us.is_some()).count() < MIN_FOR_CHANCE || candidates.is_empty() {
        return None;
    }
    let predicted = prior.and_then(|p| {
        let model = p.model_for(&workload_columns(candidates)?, seed)?;
        Some(model.predict(&candidates.iter().map(|c| c.features.clone()).collect::<Vec<_>>()))
    });
    let row = |p: usize| {
        let mut r = candidates[p].features.clone();
        if let Some(pr) = &predicted {
            r.push(pr[p]);
        }
        r
    };
    let times: Vec<Option<f64>> = observed.iter().map(|o| o.time_us).collect();
    let y = normalise_transfer(&times);
    let rows: Vec<Vec<f64>> = observed.iter().map(|o| row(o.pos)).collect();
    let free = unmeasured(candidates.len(), observed);
    let untried: Vec<usize> = (0..candidates.len()).filter(|p| free[*p]).collect();
    if untried.is_empty() {
        return Some(0.0);
    }
    let (mean, sd) = ensemble(&rows, &y, &untried.iter().map(|p| row(*p)).collect::<Vec<_>>(), seed);
    // Targets are ln(t / fastest measured): 2% faster is below -ln(1.02).
    let threshold = -(1.02f64).ln();
    // The configs' errors are far from independent (one model, one wrong belief moves them all):
    // the chance of the likeliest one, a lower bound that is not inflated by the space's size.
    let likeliest =
        mean.iter().zip(&sd).map(|(m, s)| normal_cdf((threshold - m) / s.max(MIN_SPREAD))).fold(0.0, f64::max);
    Some(likeliest)
}

/// The workload's columns (the last of every feature row, `features::workload_row`).
fn workload_columns(candidates: &[Candidate]) -> Option<[f64; 7]> {
    let row = &candidates.first()?.features;
    row.get(row.len().checked_sub(7)?..)?.try_into().ok()
}

/// Outcomes needed before `chance_of_better` answers.
pub const MIN_FOR_CHANCE: usize = 8;

/// The smallest error assumed for a prediction, in log-time (about the run-to-run noise of one
/// measurement, 1%).
const MIN_SPREAD: f64 = 0.01;

/// The standard normal distribution function (Abramowitz and Stegun 7.1.26, error < 1.5e-7).
fn normal_cdf(x: f64) -> f64 {
    let z = x.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * z);
    let poly =
        t * (0.254_829_592 + t * (-0.284_496_736 + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erf = 1.0 - poly * (-z * z).exp();
    if x >= 0.0 { 0.5 * (1.0 + erf) } else { 0.5 * (1.0 - erf) }
}

/// Members of the bootstrap ensemble that estimates how unsure the model is.
const ENSEMBLE: usize = 5;

/// Mean and standard deviation of the predictions for `query` of models fitted on bootstrap
/// resamples of (`rows`, `y`) (as Poisson weights, so every member sees every row's features).
pub(crate) fn ensemble(rows: &[Vec<f64>], y: &[f64], query: &[Vec<f64>], seed: u64) -> (Vec<f64>, Vec<f64>) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_0e05);
    // Every member's weights are drawn first, in member order, from one stream: the members then
    // fit and predict on a thread each, and the result is the same as one after another. (The
    // tracker fits this at every batch and at the end of a workload's tuning, while its next
    // tasks wait: five single-threaded fits one after another were most of that wait.)
    let draws: Vec<Vec<f64>> = (0..ENSEMBLE)
        .map(|_| {
            // Poisson(1) weights: a bootstrap without dropping rows from the feature histograms.
            (0..rows.len())
                .map(|_| {
                    let (mut k, mut p, l) = (0.0, rng.random::<f64>(), (-1.0f64).exp());
                    while p > l {
                        k += 1.0;
                        p *= rng.random::<f64>();
                    }
                    k
                })
                .collect()
        })
        .collect();
    let fit = |member: usize, weights: &[f64]| {
        CostModel::fit(rows, y, weights, seed.wrapping_add(member as u64)).ok().map(|m| m.predict(query))
    };
    let preds: Vec<Vec<f64>> = std::thread::scope(|scope| {
        let members: Vec<_> =
            draws.iter().enumerate().map(|(member, weights)| scope.spawn(move || fit(member, weights))).collect();
        members.into_iter().filter_map(|m| m.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    });
    if preds.is_empty() {
        return (vec![0.0; query.len()], vec![0.0; query.len()]);
    }
    let n = preds.len() as f64;
    let mean: Vec<f64> = (0..query.len()).map(|i| preds.iter().map(|p| p[i]).sum::<f64>() / n).collect();
    let sd =
        (0..query.len()).map(|i| (preds.iter().map(|p| (p[i] - mean[i]).powi(2)).sum::<f64>() / n).sqrt()).collect();
    (mean, sd)
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

/// The picks a cold-start batch owes each template (group) of a union space.
struct Quota {
    /// Picks each group is owed, by group; empty when no group is owed any.
    per_group: Vec<(usize, usize)>,
}

impl Quota {
    /// No group is owed anything.
    fn none() -> Quota {
        Quota { per_group: Vec::new() }
    }

    /// Half of a batch of `exploit` picks split evenly over the groups of `pool` (none for a pool
    /// of one group).
    fn new(candidates: &[Candidate], pool: &[usize], exploit: usize) -> Quota {
        let mut groups: Vec<usize> = pool.iter().map(|p| candidates[*p].group).collect();
        groups.sort_unstable();
        groups.dedup();
        if groups.len() < 2 {
            return Quota::none();
        }
        let each = exploit / (2 * groups.len());
        Quota { per_group: groups.into_iter().map(|g| (g, each)).collect() }
    }

    /// Once this workload's data trains the model: each template in contention ([`contending`])
    /// but the one whose config is fastest so far is owed `exploit / (2 * contending)` picks, its
    /// own likeliest configs. The prior's column puts a template that wins nowhere in the prior
    /// behind every config of one that wins everywhere, so no greedy pick goes to it however close
    /// its measured configs come: on the union-v19 conv n1h160w160c32 (stride 2, 32 channels, a
    /// `wmma_conv2d` tile is the best, `wgmma_conv2d`'s is 1.11x) the first batch's `wmma_conv2d`
    /// configs came within 1.14x, and then only the exploration share went to them (129 trials to
    /// 2%, a gain of 1.8x; with these picks 97 and 2.8x).
    fn trailing(contention: &Contention, exploit: usize) -> Quota {
        let groups = &contention.groups;
        if groups.len() < 2 {
            return Quota::none();
        }
        let each = exploit / (2 * groups.len());
        Quota { per_group: groups.iter().filter(|g| Some(**g) != contention.leader).map(|g| (*g, each)).collect() }
    }

    /// With `left` picks left and `taken` pool positions chosen: the pool positions of the groups
    /// still owed picks when the owed picks fill what is left, else `None` (pick from anything).
    fn owed(
        &self,
        candidates: &[Candidate],
        pool: &[usize],
        taken: &HashSet<usize>,
        left: usize,
    ) -> Option<Vec<usize>> {
        let got = |g: usize| taken.iter().filter(|i| candidates[pool[**i]].group == g).count();
        let short: Vec<(usize, usize)> =
            self.per_group.iter().map(|&(g, owed)| (g, owed.saturating_sub(got(g)))).filter(|(_, n)| *n > 0).collect();
        let owed: usize = short.iter().map(|(_, n)| n).sum();
        if owed == 0 || left > owed {
            return None;
        }
        let from: Vec<usize> = (0..pool.len())
            .filter(|i| !taken.contains(i) && short.iter().any(|(g, _)| candidates[pool[*i]].group == *g))
            .collect();
        (!from.is_empty()).then_some(from)
    }
}

/// Up to `n` of `from` (candidate positions, in the order ties go to), one at a time, each the
/// config whose knob values have been tried least so far: the sum over its knobs of 1 / (1 +
/// configs of `tried`, or picked before it, with that knob at that value, in that template).
/// A random share of a batch lands where the configs are (a uniform sample of a space where one
/// tile is 1% of it rarely tries that tile); this one tries every value of every knob early,
/// so the model sees a rare knob value before it rules it out.
fn least_tried(candidates: &[Candidate], tried: &[usize], mut from: Vec<usize>, n: usize) -> Vec<usize> {
    let key = |p: usize, k: usize| (candidates[p].group, k, candidates[p].knobs[k]);
    let mut counts: std::collections::HashMap<(usize, usize, usize), usize> = std::collections::HashMap::new();
    let count = |counts: &mut std::collections::HashMap<_, usize>, p: usize| {
        for k in 0..candidates[p].knobs.len() {
            *counts.entry(key(p, k)).or_default() += 1;
        }
    };
    for &p in tried {
        count(&mut counts, p);
    }
    let mut out = Vec::with_capacity(n.min(from.len()));
    while out.len() < n && !from.is_empty() {
        let rarity = |p: usize| -> f64 {
            (0..candidates[p].knobs.len())
                .map(|k| 1.0 / (1.0 + counts.get(&key(p, k)).copied().unwrap_or(0) as f64))
                .sum()
        };
        let mut at = 0;
        let mut most = f64::NEG_INFINITY;
        for (i, p) in from.iter().enumerate() {
            let r = rarity(*p);
            if r > most {
                (at, most) = (i, r);
            }
        }
        let p = from.remove(at);
        count(&mut counts, p);
        out.push(p);
    }
    out
}

/// How far behind the fastest config measured a template's fastest may be and still be in
/// contention on a workload ([`contending`]). Chosen on the development splits of the union-v19
/// and union-v14 conv replays (docs/BENCHMARKS.md, "Search"), 20 seeds: 1.5 and 1.25 gave the
/// union-v19 layers the same figures (n2h28w28c384 114 -> 99 trials to 2%, n1h160w160c32 129 ->
/// 97 with the trailing templates' picks, [`Quota::trailing`]), but 1.25 took union-v14's dilated
/// n4h32w32c96 from 85 trials to 2% to past 128 (its `wmma_conv2d` drops out too early); 1.5 89.
const FAMILY_MARGIN: f64 = 1.5;

/// The templates (groups) of a union still in contention on this workload: those none of whose
/// configs has been measured ok yet, and those whose fastest measured is within `margin` times
/// the fastest of all. A batch's exploration share goes to their knob values only: the rarest
/// values of a union are otherwise those of the template with the most knobs (`least_tried` sums
/// over knobs), whether or not it can win here (on the union-v19 conv layers where
/// `wgmma_conv2d` wins, `wmma_conv2d`'s best is 1.9-3.2x the best, yet its configs took all of
/// the exploration share of every batch while the winner's rarer tile heights went untried).
/// And each one behind the leader is owed picks of its own ([`Quota::trailing`]).
fn contending(candidates: &[Candidate], observed: &[Observation], margin: f64) -> Contention {
    let mut best: Vec<(usize, f64)> = Vec::new();
    for c in candidates {
        if !best.iter().any(|(g, _)| *g == c.group) {
            best.push((c.group, f64::INFINITY));
        }
    }
    let (mut fastest, mut leader) = (f64::INFINITY, None);
    for o in observed {
        let Some(t) = o.time_us else { continue };
        let group = candidates[o.pos].group;
        if let Some(b) = best.iter_mut().find(|(g, _)| *g == group) {
            b.1 = b.1.min(t);
        }
        if t < fastest {
            (fastest, leader) = (t, Some(group));
        }
    }
    let groups = best.into_iter().filter(|(_, t)| !t.is_finite() || *t <= fastest * margin).map(|(g, _)| g).collect();
    Contention { groups, leader }
}

/// The templates in contention on a workload ([`contending`]) and the one whose config is the
/// fastest measured (the first measured of equal times), if any is.
struct Contention {
    groups: Vec<usize>,
    leader: Option<usize>,
}

/// Share of a batch's greedy picks (its exploit share) that go to local moves ([`local_moves`])
/// once the search has stalled ([`LOCAL_PATIENCE`]). Chosen on the development splits of the
/// union-v19 and union-v14 replays (docs/BENCHMARKS.md, "Search"), 20 seeds, budget 128, radius 2,
/// 3 incumbents: on union-v19 conv's dev layers 0.25 took n4h64w64c128 (stride 2) from past 128
/// trials to 2% to 82, n2h28w28c384 99 -> 75, n1h160w160c32 97 -> 81; 0.5 to 51, 52 and 81; 0.75
/// to 50, 42 and 81 but union-v19's dev m3584n896k2560 tt 59 -> 100 (0.5: 73). Local moves in
/// every batch once the model trains (no patience) at 0.5 gave union-v19 conv 35, 37, 66 but took
/// union-v14's dilated n4h32w32c96 from 89 to 121 (0.5 after a stall: 87).
const LOCAL_SHARE: f64 = 0.5;

/// How far a local move goes: configs differing from an incumbent in at most this many knobs. On
/// the union-v19 conv n4h64w64c128 the 3 configs within 2% of its best (of 2,863) are one 64x64
/// tile apart in stages, raster and epilogue, and the ones the model stops at (1.02-1.05x) are 2-3
/// knobs from them, with 20-50 recorded configs within 2 knobs. 1 and 3 gave the dev split the
/// same figures as 2 at a share of 0.25 (nearer moves are taken first either way).
const LOCAL_RADIUS: usize = 2;

/// The fastest configs measured whose neighbourhoods local moves search, the fastest's first; the
/// next ones' once its neighbourhood is measured. 1 gave the dev split the same figures as 3.
const LOCAL_TOP: usize = 3;

/// Batches of trials without a new fastest config before local moves take their share: while the
/// model's picks still improve, they keep the whole batch (see [`LOCAL_SHARE`] for what local moves
/// in every batch cost).
const LOCAL_PATIENCE: usize = 1;

/// Trials measured since the fastest so far was measured (all of them before any ok outcome).
fn stalled_for(observed: &[Observation]) -> usize {
    let mut best = f64::INFINITY;
    let mut at = 0;
    for (i, o) in observed.iter().enumerate() {
        if let Some(t) = o.time_us
            && t < best
        {
            (best, at) = (t, i + 1);
        }
    }
    observed.len() - at
}

/// Local moves, the end game of a search: up to `n` pool positions (indices into `pool`) of
/// configs at most `radius` knobs from one of the `top` fastest configs measured, in the same
/// template; the fastest's neighbours first, nearer ones first, then by `scores` (lower first).
/// The model ranks what its features see; where the last few percent sit in knobs it cannot rank
/// (stages, raster, epilogue within one tile), its picks circle the right tile at 1.02-1.05x and
/// stay there, and only a walk from the incumbent, as Kernel Tuner's local searches and AutoTVM's
/// annealing make, reaches the needle.
fn local_moves(
    candidates: &[Candidate],
    observed: &[Observation],
    pool: &[usize],
    scores: &[f64],
    radius: usize,
    top: usize,
    n: usize,
) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    let mut best: Vec<(f64, usize)> = observed.iter().filter_map(|o| Some((o.time_us?, o.pos))).collect();
    best.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut out: Vec<usize> = Vec::new();
    for &(_, inc) in best.iter().take(top) {
        let here = &candidates[inc];
        let mut near: Vec<(usize, usize)> = (0..pool.len())
            .filter(|i| !out.contains(i))
            .filter_map(|i| {
                let c = &candidates[pool[i]];
                if c.group != here.group || c.knobs.len() != here.knobs.len() {
                    return None;
                }
                let d = c.knobs.iter().zip(&here.knobs).filter(|(a, b)| a != b).count();
                (d <= radius).then_some((d, i))
            })
            .collect();
        near.sort_by(|a, b| a.0.cmp(&b.0).then(scores[a.1].total_cmp(&scores[b.1])).then(a.1.cmp(&b.1)));
        out.extend(near.into_iter().map(|(_, i)| i).take(n - out.len()));
        if out.len() >= n {
            break;
        }
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
        self.propose_around(candidates, observed, &[], n)
    }

    /// The configs in flight are out of the pool, and their knob-neighbours are penalised as if
    /// this batch had picked them: the batch spreads around what is already being measured.
    fn propose_around(
        &mut self,
        candidates: &[Candidate],
        observed: &[Observation],
        pending: &[usize],
        n: usize,
    ) -> Vec<usize> {
        let mut free = unmeasured(candidates.len(), observed);
        for p in pending {
            if let Some(f) = free.get_mut(*p) {
                *f = false;
            }
        }
        // The batch depends only on the seed and what has been observed (and is in flight), so a
        // restarted tracker proposes the same batch again.
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
        // A cold start without a prior ranks configs by their templates' analytic models, which
        // were never calibrated against each other: each template of a union is then sure of a
        // share of the batch (half of it, split evenly), its own likeliest configs, taken after
        // the best by the scores. Once this workload's data trains the model, so is each template
        // still in contention that trails the fastest ([`Quota::trailing`]).
        let contention = contending(candidates, observed, FAMILY_MARGIN);
        let quota = match (trained, self.prior_scores(candidates)) {
            (false, None) => Quota::new(candidates, &pool, exploit),
            (true, _) => Quota::trailing(&contention, exploit),
            _ => Quota::none(),
        };
        let mut penalty = vec![0.0f64; pool.len()];
        for &i in &shortlist {
            let knobs = &candidates[pool[i]].knobs;
            let near =
                pending.iter().filter_map(|p| candidates.get(*p)).filter(|c| neighbours(knobs, &c.knobs)).count();
            penalty[i] += 0.5 * spread * near as f64;
        }
        let mut chosen: Vec<usize> = Vec::with_capacity(n);
        let mut taken: HashSet<usize> = HashSet::new();
        // The end game: once a batch of trials has found nothing faster, a share of the greedy
        // picks goes to the configs a knob or two from the fastest measured ([`local_moves`]),
        // chosen first so that the model's picks spread away from them.
        if trained {
            let stalled = stalled_for(observed) >= LOCAL_PATIENCE * n;
            let picks = if stalled { ((exploit as f64 * LOCAL_SHARE).round() as usize).min(exploit) } else { 0 };
            for i in local_moves(candidates, observed, &pool, &scores, LOCAL_RADIUS, LOCAL_TOP, picks) {
                taken.insert(i);
                chosen.push(pool[i]);
                for &j in &shortlist {
                    if neighbours(&candidates[pool[j]].knobs, &candidates[pool[i]].knobs) {
                        penalty[j] += 0.5 * spread;
                    }
                }
            }
        }
        while chosen.len() < exploit {
            let owed = quota.owed(candidates, &pool, &taken, exploit - chosen.len());
            let from: &[usize] = owed.as_deref().unwrap_or(&shortlist);
            let Some(&best) = from
                .iter()
                .filter(|i| !taken.contains(*i))
                .min_by(|a, b| (scores[**a] + penalty[**a]).total_cmp(&(scores[**b] + penalty[**b])))
            else {
                break;
            };
            taken.insert(best);
            chosen.push(pool[best]);
            for &i in shortlist.iter().chain(owed.iter().flatten()) {
                if neighbours(&candidates[pool[i]].knobs, &candidates[pool[best]].knobs) {
                    penalty[i] += 0.5 * spread;
                }
            }
        }
        // The exploration share: configs whose knob values the search has tried least, in the
        // templates still in contention here ([`contending`]).
        let mut rest: Vec<usize> = (0..pool.len()).filter(|i| !taken.contains(i)).map(|i| pool[i]).collect();
        let in_contention = |p: &usize| contention.groups.contains(&candidates[*p].group);
        if rest.iter().filter(|p| in_contention(p)).count() >= n - chosen.len() {
            rest.retain(in_contention);
        }
        rest.shuffle(&mut rng);
        let tried: Vec<usize> =
            observed.iter().map(|o| o.pos).chain(pending.iter().copied()).chain(chosen.iter().copied()).collect();
        let picks = n - chosen.len();
        chosen.extend(least_tried(candidates, &tried, rest, picks));
        chosen
    }
}

/// An established alternative, re-implemented to compare against on the same tables: AutoTVM's
/// XGBoost tuner as its papers and code describe it (Chen et al., "Learning to Optimize Tensor
/// Programs", 2018; `autotvm.tuner.XGBTuner`): no transfer; the first batch at random; then,
/// every batch, gradient-boosted trees fitted on this workload's outcomes, simulated annealing
/// over the space with the model as energy (parallel chains, one-knob moves, temperature falling
/// linearly from 1 to 0) keeping the best configs seen as the plan, and the batch taken from the
/// top of the plan with 5% of it at random (epsilon-greedy).
pub struct Annealing {
    seed: u64,
}

/// AutoTVM's defaults, scaled to spaces of thousands of configs: chains, steps, early stop.
const SA_CHAINS: usize = 128;
const SA_STEPS: usize = 200;
const SA_EARLY_STOP: usize = 30;
const SA_EPSILON: f64 = 0.05;

impl Annealing {
    /// A tuner for `seed`.
    pub fn new(seed: u64) -> Annealing {
        Annealing { seed }
    }
}

impl Tuner for Annealing {
    fn name(&self) -> &'static str {
        "autotvm"
    }

    fn propose(&mut self, candidates: &[Candidate], observed: &[Observation], n: usize) -> Vec<usize> {
        let free = unmeasured(candidates.len(), observed);
        let round_seed = self.seed.wrapping_mul(0x2545_f491_4f6c_dd1d).wrapping_add(observed.len() as u64);
        let mut rng = StdRng::seed_from_u64(round_seed);
        let open: Vec<usize> = (0..candidates.len()).filter(|p| free[*p]).collect();
        if open.is_empty() || n == 0 {
            return Vec::new();
        }
        let model = (!observed.is_empty())
            .then(|| {
                let times: Vec<Option<f64>> = observed.iter().map(|o| o.time_us).collect();
                let rows: Vec<Vec<f64>> = observed.iter().map(|o| candidates[o.pos].features.clone()).collect();
                CostModel::fit(&rows, &normalise(&times), &vec![1.0; rows.len()], round_seed).ok()
            })
            .flatten();
        let Some(model) = model else {
            return open.sample(&mut rng, n.min(open.len())).copied().collect();
        };
        // Annealing over knob vectors; moves that leave the valid configs are refused.
        let by_knobs: std::collections::HashMap<&[usize], usize> =
            candidates.iter().enumerate().map(|(p, c)| (c.knobs.as_slice(), p)).collect();
        // Each knob's domain; in a space of several templates (whose knob lists differ in
        // length) a move that changes the template lands on no config and is refused.
        let mut domain: Vec<usize> = Vec::new();
        for c in candidates {
            domain.resize(domain.len().max(c.knobs.len()), 1);
            for (k, v) in c.knobs.iter().enumerate() {
                domain[k] = domain[k].max(v + 1);
            }
        }
        let energy =
            |ps: &[usize]| model.predict(&ps.iter().map(|p| candidates[*p].features.clone()).collect::<Vec<_>>());
        let mut chains: Vec<usize> = (0..SA_CHAINS).map(|_| open[rng.random_range(0..open.len())]).collect();
        let mut current = energy(&chains);
        let mut plan: std::collections::BTreeMap<usize, f64> = std::collections::BTreeMap::new();
        let plan_size = (2 * n).max(n + 8);
        let mut last_change = 0;
        for step in 0..SA_STEPS {
            let t = 1.0 - step as f64 / SA_STEPS as f64;
            let moved: Vec<usize> = chains
                .iter()
                .map(|&p| {
                    let mut knobs = candidates[p].knobs.clone();
                    let k = rng.random_range(0..knobs.len());
                    knobs[k] = rng.random_range(0..domain[k]);
                    by_knobs.get(knobs.as_slice()).copied().unwrap_or(p)
                })
                .collect();
            let next = energy(&moved);
            let mut changed = false;
            for i in 0..chains.len() {
                let accept =
                    next[i] <= current[i] || rng.random::<f64>() < ((current[i] - next[i]) / t.max(1e-6)).exp();
                if accept {
                    chains[i] = moved[i];
                    current[i] = next[i];
                }
                if free[chains[i]] && !plan.contains_key(&chains[i]) {
                    let worst = plan.values().copied().fold(f64::NEG_INFINITY, f64::max);
                    if plan.len() < plan_size || current[i] < worst {
                        plan.insert(chains[i], current[i]);
                        changed = true;
                        if plan.len() > plan_size
                            && let Some((&w, _)) = plan.iter().max_by(|a, b| a.1.total_cmp(b.1))
                        {
                            plan.remove(&w);
                        }
                    }
                }
            }
            if changed {
                last_change = step;
            } else if step - last_change >= SA_EARLY_STOP {
                break;
            }
        }
        let mut ranked: Vec<(usize, f64)> = plan.into_iter().collect();
        ranked.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        let explore = ((n as f64 * SA_EPSILON).round() as usize).min(n.saturating_sub(1));
        let mut chosen: Vec<usize> = ranked.into_iter().map(|(p, _)| p).take(n - explore).collect();
        let taken: HashSet<usize> = chosen.iter().copied().collect();
        let rest: Vec<usize> = open.iter().copied().filter(|p| !taken.contains(p)).collect();
        chosen.extend(rest.sample(&mut rng, (n - chosen.len()).min(rest.len())).copied());
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
                        group: 0,
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
    fn the_chance_of_a_better_config_falls_as_the_optimum_is_found() {
        let cands = space();
        assert!((normal_cdf(0.0) - 0.5).abs() < 1e-9 && normal_cdf(3.0) > 0.998 && normal_cdf(-3.0) < 0.002);
        // Eight configs far from the optimum: a better one surely exists, and the model says it
        // may (trees do not extrapolate below the fastest measured, so it says so through the
        // ensemble's spread, cautiously); the optimum and its neighbours measured: next to none.
        let far: Vec<Observation> = (0..8)
            .map(|i| {
                let p = i * 64 + 7;
                Observation { pos: p, time_us: Some(time(&cands[p])) }
            })
            .collect();
        let early = chance_of_better(&cands, &far, None, 1).unwrap();
        let (done, _) = run(by_name("model", 4, None).unwrap().as_mut(), 200);
        let late = chance_of_better(&cands, &done, None, 1).unwrap();
        assert!(early > 0.1 && late < 0.01, "early {early:.3}, late {late:.3}");
        assert_eq!(chance_of_better(&cands, &far[..3], None, 1), None);
    }

    /// A union of two templates whose analytic models disagree with the truth across them: the
    /// first (1024 configs) estimates 0.5-1.9 us and runs 2-4.1 us; the second (64 configs)
    /// estimates 3-3.3 us and runs 1-1.3 us. Each ranks its own configs correctly.
    fn union_space() -> Vec<Candidate> {
        let mut out = Vec::new();
        for (group, side) in [(0usize, 32usize), (1, 8)] {
            for a in 0..side {
                for b in 0..side {
                    let bowl = ((a as f64 - 3.0).powi(2) + (b as f64 - 5.0).powi(2)) / (side * side) as f64;
                    // As `features::UnionLayout` lays rows out: a one-hot of the template, then
                    // each template's own columns, missing (NaN) in the other's rows.
                    let mut features = vec![f64::NAN; 8];
                    features[group] = 1.0;
                    features[1 - group] = 0.0;
                    features[2 + 3 * group..5 + 3 * group].copy_from_slice(&[a as f64, b as f64, bowl]);
                    out.push(Candidate {
                        index: (a * side + b) as u64,
                        features,
                        knobs: vec![group, a, b],
                        analytic_us: if group == 0 { 0.5 + bowl } else { 3.0 + bowl },
                        group,
                    });
                }
            }
        }
        out
    }

    fn union_time(c: &Candidate) -> f64 {
        if c.group == 0 { 2.0 + 1.5 * c.features[4] } else { 1.0 + c.features[7] }
    }

    #[test]
    fn a_cold_start_gives_every_template_of_a_union_a_share_of_the_first_batch() {
        let cands = union_space();
        let mut tuner = ModelGuided::new(1, None);
        let first = tuner.propose(&cands, &[], 16);
        let second_group = first.iter().filter(|p| cands[**p].group == 1).count();
        assert_eq!(second_group, 4, "half of 16 picks split over two templates");
        // The best by the (misleading) estimates come first; the owed picks are each template's
        // own likeliest configs.
        assert!(first[..12].iter().all(|p| cands[*p].group == 0));
        let owed_best = first[12..].iter().map(|p| cands[*p].analytic_us).fold(f64::INFINITY, f64::min);
        let group_best = cands.iter().filter(|c| c.group == 1).map(|c| c.analytic_us).fold(f64::INFINITY, f64::min);
        assert_eq!(owed_best, group_best);
        // Their outcomes teach the model that the second template is faster: two batches later
        // the search is within 10% of the true best, which only the second template holds.
        let mut observed: Vec<Observation> =
            first.iter().map(|&pos| Observation { pos, time_us: Some(union_time(&cands[pos])) }).collect();
        for _ in 0..2 {
            for pos in tuner.propose(&cands, &observed, 16) {
                observed.push(Observation { pos, time_us: Some(union_time(&cands[pos])) });
            }
        }
        let best = observed.iter().filter_map(|o| o.time_us).fold(f64::INFINITY, f64::min);
        assert!(best <= 1.1, "best after 48 trials: {best}");
        // A space of one template, or a prior, leaves the batch to the scores alone.
        let one: Vec<Candidate> = cands.iter().filter(|c| c.group == 0).cloned().collect();
        assert_eq!(Quota::new(&one, &(0..one.len()).collect::<Vec<_>>(), 16).per_group, Vec::new());
    }

    #[test]
    fn a_batch_proposed_while_another_measures_skips_it() {
        let cands = space();
        let mut tuner = ModelGuided::new(5, None);
        let first = tuner.propose(&cands, &[], 8);
        let second = tuner.propose_around(&cands, &[], &first, 8);
        assert_eq!(second.len(), 8);
        assert!(second.iter().all(|p| !first.contains(p)), "{first:?} then {second:?}");
        // Asked again with the first batch measured, it proposes none of the second either.
        let observed: Vec<Observation> =
            first.iter().map(|&pos| Observation { pos, time_us: Some(time(&cands[pos])) }).collect();
        let third = tuner.propose_around(&cands, &observed, &second, 8);
        assert_eq!(third.len(), 8);
        assert!(third.iter().all(|p| !first.contains(p) && !second.contains(p)), "{third:?}");
        // The default for the other tuners: as many new ones, none of those in flight.
        let mut random = Random { seed: 1 };
        let r1 = random.propose(&cands, &[], 8);
        let r2 = random.propose_around(&cands, &[], &r1, 8);
        assert_eq!(r2.len(), 8);
        assert!(r2.iter().all(|p| !r1.contains(p)));
    }

    #[test]
    fn a_prior_trains_on_the_nearest_workloads_and_a_capped_share_of_each() {
        // The fastest half of the cap first, then an even spread of the rest; ties by position.
        let y: Vec<f64> = (0..10).map(|i| f64::from(9 - i)).collect();
        assert_eq!(capped(&y, 4), vec![3, 7, 8, 9]);
        assert_eq!(capped(&y, 20), (0..10).collect::<Vec<_>>());
        // The k nearest of each target, each once.
        let at = |m: f64| [m, 6.0, 9.0, 2.0, 4.0, 1.0, 0.0];
        let sources = [at(4.0), at(8.0), at(12.0), at(9.0), at(5.0)];
        assert_eq!(nearest(&sources, &[at(4.0)], 2), vec![0, 4]);
        assert_eq!(nearest(&sources, &[at(4.0), at(12.0)], 2), vec![0, 2, 3, 4]);
        // A prior of more workloads and rows than a model trains on (small bounds: the product's
        // are above every shipped file, see PRIOR_WORKLOADS).
        let (workloads, cap) = (4, 30);
        let mut prior = Prior::default();
        for w in 0..(workloads + 3) {
            let n = cap + 5;
            let rows: Vec<Vec<f64>> = (0..n).map(|i| vec![i as f64]).collect();
            let times: Vec<Option<f64>> = (0..n).map(|i| Some(1.0 + i as f64)).collect();
            prior.extend(at(w as f64), rows, &times);
        }
        let picked = prior.selection_of(&at(0.0), workloads, cap);
        assert_eq!(picked.len(), workloads * cap);
        let far = at((workloads + 2) as f64);
        assert!(picked.iter().all(|i| prior.sources[*i] != far), "a far workload trained the model");
    }

    #[test]
    fn a_prior_leaves_out_a_workload_measured_with_part_of_what_another_was() {
        let (both, first, second) = (vec![true, true], vec![true, false], vec![false, true]);
        assert_eq!(covering(&[first.clone(), both.clone(), second.clone(), both.clone()]), [false, true, false, true]);
        // No workload has the second template: it demands nothing.
        assert_eq!(covering(&[first.clone(), first.clone()]), [true, true]);
        // Neither has more than the other: both are kept.
        assert_eq!(covering(&[first.clone(), second]), [true, true]);
        // Three templates: {0} is inside {0, 1}; {0, 2} is not.
        let (a, b) = (vec![true, true, false], vec![true, false, true]);
        assert_eq!(covering(&[a, b, vec![true, false, false]]), [true, true, false]);
        assert!(covering(&[]).is_empty());
    }

    #[test]
    fn exploration_tries_the_knob_values_tried_least() {
        let cands = space();
        // Every config whose knobs are all below 4 tried: the exploration picks take each knob's
        // untried values first, one new value of every knob a pick (ties to the earlier).
        let tried: Vec<usize> = (0..cands.len()).filter(|p| cands[*p].knobs.iter().all(|v| *v < 4)).collect();
        let from: Vec<usize> = (0..cands.len()).filter(|p| !tried.contains(p)).collect();
        let picks = least_tried(&cands, &tried, from, 4);
        let knobs: Vec<&[usize]> = picks.iter().map(|p| cands[*p].knobs.as_slice()).collect();
        assert_eq!(knobs, [[4, 4, 4], [5, 5, 5], [6, 6, 6], [7, 7, 7]]);
        // Asked for more than there are: all of them, the rarer first.
        assert_eq!(least_tried(&cands, &tried, vec![4, 511], 5), vec![511, 4]);
    }

    #[test]
    fn local_moves_walk_from_the_fastest_measured() {
        let cands = space();
        let at = |a: usize, b: usize, c: usize| a * 64 + b * 8 + c;
        let measured = [at(0, 0, 0), at(5, 2, 4), at(5, 5, 3), at(7, 7, 7)];
        let observed: Vec<Observation> =
            measured.iter().map(|&pos| Observation { pos, time_us: Some(time(&cands[pos])) }).collect();
        assert_eq!(stalled_for(&observed), 2, "the fastest is (5, 2, 4), second of four");
        assert_eq!(stalled_for(&[Observation { pos: 0, time_us: None }]), 1);
        let free = unmeasured(cands.len(), &observed);
        let pool: Vec<usize> = (0..cands.len()).filter(|p| free[*p]).collect();
        // Scores that rank nothing: the moves go by distance from the fastest, then position.
        let flat = vec![0.0; pool.len()];
        let moves: Vec<usize> =
            local_moves(&cands, &observed, &pool, &flat, 2, 3, 30).iter().map(|i| pool[*i]).collect();
        let from = |p: usize, q: usize| cands[p].knobs.iter().zip(&cands[q].knobs).filter(|(a, b)| a != b).count();
        // Its 21 neighbours one knob away, then those two away; none measured, none twice.
        assert!(moves[..21].iter().all(|p| from(*p, at(5, 2, 4)) == 1), "{moves:?}");
        assert!(moves[21..].iter().all(|p| from(*p, at(5, 2, 4)) == 2));
        assert!(moves.contains(&at(5, 2, 6)), "the optimum, one knob from the fastest");
        assert_eq!(moves.iter().collect::<HashSet<_>>().len(), moves.len());
        assert!(moves.iter().all(|p| free[*p]));
        // Past the fastest's neighbourhood (21 + 147 within 2 knobs, less the one measured), the
        // next fastest's.
        let all = local_moves(&cands, &observed, &pool, &flat, 2, 3, 200);
        assert_eq!(all.len(), 200);
        assert!(all[..167].iter().all(|i| from(pool[*i], at(5, 2, 4)) <= 2));
        assert!(all[167..].iter().all(|i| from(pool[*i], at(5, 5, 3)) <= 2 && from(pool[*i], at(5, 2, 4)) > 2));
        assert!(local_moves(&cands, &observed, &pool, &flat, 2, 3, 0).is_empty());
    }

    #[test]
    fn exhausts_the_space_without_repeats() {
        let (observed, _) = run(by_name("model", 9, None).unwrap().as_mut(), 512);
        let distinct: HashSet<usize> = observed.iter().map(|o| o.pos).collect();
        assert_eq!(distinct.len(), 512);
    }
}
