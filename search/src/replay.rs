//! Replay: run a tuner against recorded measurements instead of a GPU. The records of an
//! exhaustive measurement (every valid config of a workload, measured on one GPU) are the ground
//! truth: a tuner proposes, the record set answers, and we count how many trials it needs to come
//! within 5% and 2% of the true best. Configs that were not recorded are not candidates.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::sync::Arc;

use tensortune_kernels::{Config, Template, Workload, registry};

use crate::Error;
use crate::features::{UnionLayout, WORKLOAD_FEATURES, row, target_for_class};
use crate::records::RecordLine;
use crate::tuner::{Candidate, Observation, Prior, by_name, chance_of_better, lookahead};

/// One workload's recorded space: the configs of every template recorded for it on one device
/// class (the newest version of each), in one feature layout, as a job that names no template
/// searches them.
pub struct Recorded {
    /// Workload key.
    pub key: String,
    /// The workload.
    pub workload: Workload,
    /// Device class it was measured on.
    pub device_class: String,
    /// Templates and versions, in slot (registry) order.
    pub templates: Vec<(String, u32)>,
    /// The recorded configs (feature rows in the layout of `templates`).
    pub candidates: Vec<Candidate>,
    /// Slot of each candidate's template.
    pub slots: Vec<usize>,
    /// Each candidate's row in its template's own layout (to embed into another's).
    own_rows: Vec<Vec<f64>>,
    /// Their outcome: fastest ok median, or `None` when every record of the config failed.
    pub truth: Vec<Option<f64>>,
    /// The fastest recorded time.
    pub best_us: f64,
}

impl Recorded {
    /// Templates as `name vN[+name vN]`.
    pub fn template_label(&self) -> String {
        self.templates.iter().map(|(t, v)| format!("{t} v{v}")).collect::<Vec<_>>().join(" + ")
    }
}

/// Every workload of a record file.
pub struct Dataset {
    /// Workloads, by key order.
    pub workloads: Vec<Recorded>,
}

/// One workload's records of one template version, per config: its fastest ok time.
type Configs = HashMap<String, (Config, Option<f64>)>;

impl Dataset {
    /// Reads JSON-lines records, plain or gzip-compressed (`.gz`).
    pub fn load(path: &Path) -> Result<Dataset, Error> {
        let file =
            std::fs::File::open(path).map_err(|e| Error::Data(format!("cannot open {}: {e}", path.display())))?;
        let reader: Box<dyn Read> = if path.extension().is_some_and(|e| e == "gz") {
            Box::new(flate2::read::GzDecoder::new(file))
        } else {
            Box::new(file)
        };
        Dataset::read(BufReader::new(reader), &path.display().to_string())
    }

    /// Reads several record files into one dataset (records of one workload in several files are
    /// merged).
    pub fn load_all(paths: &[impl AsRef<Path>]) -> Result<Dataset, Error> {
        let mut text = Vec::new();
        for path in paths {
            let path = path.as_ref();
            let file =
                std::fs::File::open(path).map_err(|e| Error::Data(format!("cannot open {}: {e}", path.display())))?;
            let mut reader: Box<dyn Read> = if path.extension().is_some_and(|e| e == "gz") {
                Box::new(flate2::read::GzDecoder::new(file))
            } else {
                Box::new(file)
            };
            reader.read_to_end(&mut text).map_err(|e| Error::Data(format!("{}: {e}", path.display())))?;
            if text.last().is_some_and(|b| *b != b'\n') {
                text.push(b'\n');
            }
        }
        let origin = paths.iter().map(|p| p.as_ref().display().to_string()).collect::<Vec<_>>().join(", ");
        Dataset::read(text.as_slice(), &origin)
    }

    /// Reads JSON-lines records from `reader` (`origin` names it in errors).
    pub fn read(reader: impl BufRead, origin: &str) -> Result<Dataset, Error> {
        // (workload, class) -> (template, version) -> config JSON -> best outcome.
        type Key = (String, String);
        let mut groups: BTreeMap<Key, BTreeMap<(String, u32), Configs>> = BTreeMap::new();
        for (n, line) in reader.lines().enumerate() {
            let line = line.map_err(|e| Error::Data(format!("{origin}: {e}")))?;
            if line.trim().is_empty() {
                continue;
            }
            let l =
                RecordLine::parse(&line).map_err(|e| Error::Data(format!("{origin}:{}: not a record: {e}", n + 1)))?;
            let outcome = l.ok_time();
            let config = l.config;
            let slot = groups
                .entry((l.workload, l.device_class))
                .or_default()
                .entry((l.template, l.template_version))
                .or_default()
                .entry(config.to_json())
                .or_insert((config, None));
            slot.1 = match (slot.1, outcome) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        let mut workloads = Vec::new();
        for ((key, class), by_template) in groups {
            let workload = Workload::from_key(&key).map_err(|e| Error::Data(format!("{origin}: {e}")))?;
            let target = target_for_class(&class);
            // The newest recorded version of each template, in registry order (the slots of a job
            // that names no template).
            let mut parts: Vec<(&'static dyn Template, u32, Configs)> = Vec::new();
            for ((name, version), configs) in by_template {
                let template = registry::by_name(&name)?;
                match parts.iter_mut().find(|p| p.0.name() == name) {
                    Some(p) if p.1 < version => (p.1, p.2) = (version, configs),
                    Some(_) => {}
                    None => parts.push((template, version, configs)),
                }
            }
            let order: Vec<&str> = registry::all().iter().map(|t| t.name()).collect();
            parts.sort_by_key(|p| order.iter().position(|n| *n == p.0.name()));
            let mut candidates = Vec::new();
            let mut slots = Vec::new();
            let mut own_rows = Vec::new();
            let mut truth = Vec::new();
            let mut widths = Vec::new();
            let mut templates = Vec::new();
            for (slot, (template, version, configs)) in parts.into_iter().enumerate() {
                let space = template.space();
                let mut configs: Vec<(Config, Option<f64>)> = configs.into_values().collect();
                configs.sort_by(|a, b| a.0.cmp(&b.0));
                let mut width = None;
                for (config, outcome) in configs {
                    // Records of another template version may carry knobs this build no longer has.
                    let (Ok(index), Ok(mut knobs), Ok((features, analytic_us))) =
                        (space.index_of(&config), space.positions(&config), row(template, &workload, &config, &target))
                    else {
                        continue;
                    };
                    width = Some(features.len() - WORKLOAD_FEATURES.len());
                    knobs.insert(0, slot);
                    own_rows.push(features.clone());
                    candidates.push(Candidate { index, features, knobs, analytic_us, group: slot });
                    slots.push(slot);
                    truth.push(outcome);
                }
                widths.push(width.unwrap_or(0));
                templates.push((template.name().to_owned(), version));
            }
            let layout = UnionLayout::new(widths);
            for (c, slot) in candidates.iter_mut().zip(&slots) {
                c.features = layout.embed(*slot, &c.features).unwrap_or_default();
            }
            let best_us = truth.iter().flatten().copied().fold(f64::INFINITY, f64::min);
            if candidates.is_empty() || !best_us.is_finite() {
                continue;
            }
            workloads.push(Recorded {
                key,
                workload,
                device_class: class,
                templates,
                candidates,
                slots,
                own_rows,
                truth,
                best_us,
            });
        }
        if workloads.is_empty() {
            return Err(Error::Data(format!("{origin}: no workload with an ok record of a config this build knows")));
        }
        Ok(Dataset { workloads })
    }

    /// Transfer data for `target` from at most `count` other workloads of its device class and op,
    /// chosen at random with `seed` (a store that holds only that many): see [`Dataset::prior_for`].
    pub fn prior_from_some(&self, target: &Recorded, count: usize, seed: u64) -> Prior {
        use rand::SeedableRng;
        use rand::seq::SliceRandom;
        let mut others: Vec<&str> = self
            .workloads
            .iter()
            .filter(|w| {
                w.key != target.key && w.device_class == target.device_class && w.workload.op() == target.workload.op()
            })
            .map(|w| w.key.as_str())
            .collect();
        others.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
        others.truncate(count);
        self.prior_among(target, &others)
    }

    /// Transfer data for `target`: every other workload of the same device class and op, its
    /// configs of the templates `target` has (same versions, or versions whose records hold today),
    /// in `target`'s layout, less the workloads another of them has more of those templates than
    /// (`tuner::covering`, as the tracker's prior). Each workload's records are normalised
    /// together, across its templates.
    pub fn prior_for(&self, target: &Recorded) -> Prior {
        let all: Vec<&str> = self.workloads.iter().map(|w| w.key.as_str()).collect();
        self.prior_among(target, &all)
    }

    /// [`Dataset::prior_for`] from the workloads whose keys are in `keys` only.
    fn prior_among(&self, target: &Recorded, keys: &[&str]) -> Prior {
        let widths: Vec<usize> = (0..target.templates.len())
            .map(|s| {
                let p = target.slots.iter().position(|x| *x == s).unwrap_or(0);
                target.own_rows[p].len() - WORKLOAD_FEATURES.len()
            })
            .collect();
        let layout = UnionLayout::new(widths);
        // Per prior workload: its rows, their times, and which of `target`'s templates it has.
        let mut parts = Vec::new();
        for w in &self.workloads {
            if w.key == target.key
                || w.device_class != target.device_class
                || w.workload.op() != target.workload.op()
                || !keys.contains(&w.key.as_str())
            {
                continue;
            }
            let mut rows = Vec::new();
            let mut times = Vec::new();
            let mut holds = vec![false; target.templates.len()];
            for ((row, slot), t) in w.own_rows.iter().zip(&w.slots).zip(&w.truth) {
                let Some(to) = target.templates.iter().position(|x| same_kernels(x, &w.templates[*slot])) else {
                    continue;
                };
                if let Some(r) = layout.embed(to, row) {
                    rows.push(r);
                    times.push(*t);
                    holds[to] = true;
                }
            }
            if !rows.is_empty() {
                parts.push((w, rows, times, holds));
            }
        }
        let keep = crate::tuner::covering(&parts.iter().map(|p| p.3.clone()).collect::<Vec<_>>());
        let mut prior = Prior::default();
        for ((w, rows, times, _), keep) in parts.into_iter().zip(keep) {
            if keep {
                prior.extend(crate::features::workload_row(&w.workload), rows, &times);
            }
        }
        prior
    }
}

/// Whether records of template version `b` describe the kernels of `a`: the same version, or two
/// versions whose records both hold today (`Template::records_hold_for`), as the tracker's prior
/// reads them (`wgmma_gemm` v15's records of a workload v14 took are v14's kernels).
fn same_kernels(a: &(String, u32), b: &(String, u32)) -> bool {
    a.0 == b.0
        && (a.1 == b.1 || registry::by_name(&a.0).is_ok_and(|t| t.records_hold_for(a.1) && t.records_hold_for(b.1)))
}

/// How one tuning run went.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    /// Trials until the best found was within 5% of the true best (`None`: never).
    pub to_5: Option<usize>,
    /// Trials until within 2%.
    pub to_2: Option<usize>,
    /// Best found over the true best when the run ended (after the budget, or as soon as it was
    /// within 2%).
    pub final_ratio: f64,
    /// When the run ended (a calibrated model run only): the model's chance that an unmeasured
    /// config is >= 2% faster than the best found (`tuner::chance_of_better`), and whether one is
    /// (from the table).
    pub chance: Option<(f64, bool)>,
}

/// Runs `tuner_name` (seeded) on `data` for `budget` trials in batches of `batch`; with
/// `calibrate`, a model run also gives its chance that a better config is left ([`Run::chance`]).
pub fn run(
    data: &Recorded,
    tuner_name: &str,
    seed: u64,
    prior: Option<Arc<Prior>>,
    budget: usize,
    batch: usize,
    calibrate: bool,
) -> Result<Run, Error> {
    let (mut to_5, mut to_2) = (None, None);
    let (observed, best) = walk(data, tuner_name, seed, prior.clone(), budget, batch, |trials, best| {
        if to_5.is_none() && best <= data.best_us * 1.05 {
            to_5 = Some(trials);
        }
        if to_2.is_none() && best <= data.best_us * 1.02 {
            to_2 = Some(trials);
        }
        // Both thresholds reached: the rest of the budget would measure nothing the table shows.
        to_2.is_none() || to_5.is_none()
    })?;
    let better_exists = {
        let free = observed.iter().map(|o| o.pos).collect::<std::collections::HashSet<_>>();
        data.truth.iter().enumerate().any(|(p, t)| !free.contains(&p) && t.is_some_and(|t| t * 1.02 <= best))
    };
    let chance = (calibrate && tuner_name == "model")
        .then(|| chance_of_better(&data.candidates, &observed, prior.as_deref(), seed))
        .flatten()
        .map(|c| (c, better_exists));
    Ok(Run { to_5, to_2, final_ratio: best / data.best_us, chance })
}

/// Best found over the true best after each trial of a run of `tuner_name` (seeded) on `data`,
/// for the whole budget (capped at the space); infinite until the first ok config.
pub fn curve(
    data: &Recorded,
    tuner_name: &str,
    seed: u64,
    prior: Option<Arc<Prior>>,
    budget: usize,
    batch: usize,
) -> Result<Vec<f64>, Error> {
    let mut out = Vec::new();
    walk(data, tuner_name, seed, prior, budget, batch, |_, best| {
        out.push(best / data.best_us);
        true
    })?;
    Ok(out)
}

/// Runs the tuner batch by batch as the tracker does, calling `step(trials so far, best time so
/// far)` after every trial, until the budget (capped at the space) is spent, the tuner has nothing
/// to propose, or `step` returns false (then what is in flight still comes in). Like the tracker,
/// it asks for the next batch once no more than [`lookahead`] configs are still in flight, around
/// them (`Tuner::propose_around`); outcomes come in the order proposed. Returns what was observed
/// and the best time.
fn walk(
    data: &Recorded,
    tuner_name: &str,
    seed: u64,
    prior: Option<Arc<Prior>>,
    budget: usize,
    batch: usize,
    mut step: impl FnMut(usize, f64) -> bool,
) -> Result<(Vec<Observation>, f64), Error> {
    let mut tuner = by_name(tuner_name, seed, prior)?;
    let budget = budget.min(data.candidates.len());
    let ahead = lookahead(batch);
    let mut observed: Vec<Observation> = Vec::with_capacity(budget);
    let mut in_flight: std::collections::VecDeque<usize> = std::collections::VecDeque::new();
    let mut best = f64::INFINITY;
    let mut go_on = true;
    loop {
        let room = budget - observed.len() - in_flight.len();
        if go_on && room > 0 && in_flight.len() <= ahead {
            let next = tuner.propose_around(&data.candidates, &observed, in_flight.make_contiguous(), batch.min(room));
            if !next.is_empty() {
                in_flight.extend(next);
                continue;
            }
        }
        let Some(pos) = in_flight.pop_front() else { break };
        let time_us = data.truth[pos];
        observed.push(Observation { pos, time_us });
        if let Some(t) = time_us {
            best = best.min(t);
        }
        go_on &= step(observed.len(), best);
    }
    Ok((observed, best))
}

/// The learning curve of transfer on one workload: for each count of other workloads in the
/// store (`counts`, each capped at what the data holds), the median over `seeds` of the model
/// tuner's trials to within 2% of the best, each seed with its own random choice of that many
/// workloads as the prior (0: the model alone). Returns (count, median trials to 2%).
pub fn learning_curve(
    data: &Dataset,
    target: &Recorded,
    counts: &[usize],
    seeds: u64,
    budget: usize,
    batch: usize,
) -> Result<Vec<(usize, usize)>, Error> {
    let mut out = Vec::new();
    for &count in counts {
        let runs = per_seed(seeds, |seed| {
            let prior = data.prior_from_some(target, count, seed);
            let prior = (!prior.is_empty()).then(|| Arc::new(prior));
            run(target, "model", seed, prior, budget, batch, false)
        })?;
        let cap = budget.min(target.candidates.len()) + 1;
        out.push((count, median(runs.iter().map(|r| r.to_2.unwrap_or(cap)).collect())));
    }
    Ok(out)
}

/// `one(seed)` for seeds 0..`seeds`, each on a thread of its own; the first error, if any.
fn per_seed(seeds: u64, one: impl Fn(u64) -> Result<Run, Error> + Sync) -> Result<Vec<Run>, Error> {
    let one = &one;
    let runs: Vec<Result<Run, Error>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..seeds).map(|seed| s.spawn(move || one(seed))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(Error::Model("a replay thread panicked".into()))))
            .collect()
    });
    runs.into_iter().collect()
}

/// Medians over seeds of one tuner on one workload.
#[derive(Clone, Debug)]
pub struct Summary {
    /// Workload key.
    pub workload: String,
    /// Tuner name.
    pub tuner: String,
    /// Whether other workloads' records trained its model.
    pub transfer: bool,
    /// Median trials to 5% (runs that never got there count as budget + 1).
    pub to_5: usize,
    /// Median trials to 2%.
    pub to_2: usize,
    /// Median best found / true best.
    pub final_ratio: f64,
    /// Seeds run.
    pub seeds: u64,
    /// Configs in the recorded space.
    pub space: usize,
    /// Per seed, at the end of its run: the predicted chance that an unmeasured config is >= 2%
    /// faster than the best found, and whether one was ([`summarise_calibrated`] only).
    pub chances: Vec<(f64, bool)>,
}

fn median(mut v: Vec<usize>) -> usize {
    v.sort_unstable();
    v[v.len() / 2]
}

/// Runs seeds 0..`seeds` on threads and takes medians.
pub fn summarise(
    data: &Recorded,
    tuner: &str,
    prior: Option<Arc<Prior>>,
    seeds: u64,
    budget: usize,
    batch: usize,
) -> Result<Summary, Error> {
    summarise_runs(data, tuner, prior, seeds, budget, batch, false)
}

/// [`summarise`] with the model's calibration: each model run's chance that a better config is
/// left ([`Summary::chances`]). It costs a prediction over the whole space per seed, which the
/// trial counts do not need.
pub fn summarise_calibrated(
    data: &Recorded,
    tuner: &str,
    prior: Option<Arc<Prior>>,
    seeds: u64,
    budget: usize,
    batch: usize,
) -> Result<Summary, Error> {
    summarise_runs(data, tuner, prior, seeds, budget, batch, true)
}

fn summarise_runs(
    data: &Recorded,
    tuner: &str,
    prior: Option<Arc<Prior>>,
    seeds: u64,
    budget: usize,
    batch: usize,
    calibrate: bool,
) -> Result<Summary, Error> {
    let runs = per_seed(seeds, |seed| run(data, tuner, seed, prior.clone(), budget, batch, calibrate))?;
    let cap = budget.min(data.candidates.len()) + 1;
    let mut ratios: Vec<f64> = runs.iter().map(|r| r.final_ratio).collect();
    ratios.sort_by(f64::total_cmp);
    Ok(Summary {
        workload: data.key.clone(),
        tuner: tuner.to_owned(),
        transfer: prior.is_some(),
        to_5: median(runs.iter().map(|r| r.to_5.unwrap_or(cap)).collect()),
        to_2: median(runs.iter().map(|r| r.to_2.unwrap_or(cap)).collect()),
        final_ratio: ratios[ratios.len() / 2],
        seeds,
        space: data.candidates.len(),
        chances: runs.iter().filter_map(|r| r.chance).collect(),
    })
}

/// One held-out workload: random search over its whole space, and each tuner with the
/// workload's own records hidden (the transfer prior holds only the other workloads').
#[derive(Clone, Debug)]
pub struct Holdout {
    /// Random search (budget: the whole space, so its medians are never capped).
    pub random: Summary,
    /// The tuners: `model` without transfer, `model` with the other workloads as its prior, then
    /// any others asked for.
    pub tuners: Vec<Summary>,
}

impl Holdout {
    /// Random's median trials to 5% over the tuner's (how many times fewer trials it needs).
    pub fn gain_5(&self, tuner: &Summary) -> f64 {
        self.random.to_5 as f64 / tuner.to_5.max(1) as f64
    }
}

/// Leave-one-workload-out: for each workload of `data` (or those whose key contains `only`),
/// random search, the model tuner alone, the model tuner with every other workload of the same
/// device class and op as its prior, and each of `extra` tuners (without transfer); `seeds` seeds
/// each, at most `budget` trials in batches of `batch`.
pub fn holdout(
    data: &Dataset,
    extra: &[String],
    only: Option<&str>,
    seeds: u64,
    budget: usize,
    batch: usize,
) -> Result<Vec<Holdout>, Error> {
    let mut out = Vec::new();
    for w in &data.workloads {
        if only.is_some_and(|f| !w.key.contains(f)) {
            continue;
        }
        let random = summarise(w, "random", None, seeds, w.candidates.len(), batch)?;
        let mut tuners = vec![summarise_calibrated(w, "model", None, seeds, budget, batch)?];
        let prior = data.prior_for(w);
        if !prior.is_empty() {
            tuners.push(summarise_calibrated(w, "model", Some(Arc::new(prior)), seeds, budget, batch)?);
        }
        for t in extra {
            tuners.push(summarise(w, t, None, seeds, budget, batch)?);
        }
        out.push(Holdout { random, tuners });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines() -> String {
        let w = "matmul/m512n64k512/nn/f16,f32,f32/alpha=1,beta=0";
        let valid = tensortune_kernels::template::valid_configs(
            &tensortune_kernels::gemm::WmmaGemm,
            &Workload::from_key(w).unwrap(),
            &tensortune_kernels::Target::sm90(),
        )
        .unwrap();
        let mut out = String::new();
        for (i, (_, c)) in valid.iter().take(60).enumerate() {
            let status = if i % 10 == 3 { "compile_error" } else { "ok" };
            let t = 2.0 + ((i * 37) % 60) as f64 / 10.0;
            out.push_str(&format!(
                "{{\"workload\":\"{w}\",\"template\":\"wmma_gemm\",\"template_version\":1,\"config\":{},\"device_class\":\"nvidia-h200/sm90/132sm\",\"status\":\"{status}\",\"median_us\":{t}}}\n",
                c.to_json()
            ));
        }
        out
    }

    #[test]
    fn reads_records_and_replays() {
        let data = Dataset::read(lines().as_bytes(), "test").unwrap();
        assert_eq!(data.workloads.len(), 1);
        let w = &data.workloads[0];
        assert_eq!(w.candidates.len(), 60);
        assert_eq!(w.truth.iter().filter(|t| t.is_none()).count(), 6);
        let exhaustive = run(w, "grid", 0, None, 1000, 8, false).unwrap();
        assert_eq!(exhaustive.final_ratio, 1.0);
        assert!(exhaustive.to_2.unwrap() <= 60);
        let s = summarise(w, "random", None, 5, 1000, 8).unwrap();
        assert!(s.to_5 <= 60 && s.final_ratio == 1.0);
        assert!(Dataset::read("{\"x\":1}\n".as_bytes(), "bad").is_err());
    }

    #[test]
    fn a_prior_reads_the_versions_whose_records_hold_today() {
        let v = |t: &str, n: u32| (t.to_owned(), n);
        let current = tensortune_kernels::version::WGMMA_GEMM;
        let oldest = tensortune_kernels::version::WGMMA_RECORDS_HOLD_SINCE;
        assert!(same_kernels(&v("wgmma_gemm", oldest), &v("wgmma_gemm", current)));
        assert!(
            !same_kernels(&v("wgmma_gemm", oldest - 1), &v("wgmma_gemm", current)),
            "a version that no longer holds"
        );
        assert!(same_kernels(&v("wgmma_gemm", 2), &v("wgmma_gemm", 2)), "old files replay among themselves");
        assert!(!same_kernels(&v("wmma_gemm", 6), &v("wgmma_gemm", 6)));
    }

    #[test]
    fn the_walk_proposes_ahead_without_measuring_a_config_twice() {
        let data = Dataset::read(lines().as_bytes(), "test").unwrap();
        let w = &data.workloads[0];
        assert!((1..8).contains(&lookahead(8)), "batches of 8 look ahead by {}", lookahead(8));
        for (budget, want) in [(37, 37), (1000, 60)] {
            let (observed, _) = walk(w, "model", 1, None, budget, 8, |_, _| true).unwrap();
            let distinct: std::collections::HashSet<usize> = observed.iter().map(|o| o.pos).collect();
            assert_eq!((observed.len(), distinct.len()), (want, want), "budget {budget}");
        }
        // Stopped early, it ends once what is in flight is in: at most a batch and the look-ahead.
        let (observed, _) = walk(w, "model", 1, None, 1000, 8, |n, _| n < 5).unwrap();
        assert!((5..=8 + lookahead(8) + 1).contains(&observed.len()), "{}", observed.len());
    }

    #[test]
    fn curves_fall_to_the_true_best_over_the_whole_budget() {
        let data = Dataset::read(lines().as_bytes(), "test").unwrap();
        let w = &data.workloads[0];
        let c = curve(w, "random", 3, None, 1000, 8).unwrap();
        // The whole space, no early stop, and best-so-far never rises.
        assert_eq!(c.len(), 60);
        assert!(c.windows(2).all(|p| p[1] <= p[0]));
        assert_eq!(*c.last().unwrap(), 1.0);
        assert_eq!(curve(w, "grid", 0, None, 10, 4).unwrap().len(), 10);
        // The run of the same seed reaches 2% where the curve first does.
        let r = run(w, "random", 3, None, 1000, 8, false).unwrap();
        assert_eq!(r.to_2, c.iter().position(|&x| x <= 1.02).map(|i| i + 1));
    }
}
