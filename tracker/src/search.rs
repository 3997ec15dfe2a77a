//! The in-memory side of each workload's search: its valid configs, its tuner, the configs that
//! already have a task and the outcomes of those that finished. All of it is derived from the
//! database (and rebuilt after a restart); it lives in memory because enumerating a template's
//! space against a device walks hundreds of thousands of points, and a model tuner also needs
//! every valid config's feature row. A job that searches several templates has one space per
//! workload across them: candidates are [`Point`]s (template slot, config index).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tensortune_kernels::{Config, Target, Template, Workload};
use tensortune_search::features::{self, UnionLayout};
use tensortune_search::tuner::{Candidate, Prior};

use crate::error::{Error, Result};
use crate::model::{JobId, Status};
use crate::store::records::PriorRecord;
use crate::tuner::{Observed, Point, Taken, Tuner, WorkloadSpace};

/// Identifies a workload of a job.
pub(crate) type SearchKey = (JobId, u32);

/// Identifies a transfer prior: a job and the template slots of the space it serves (workloads of
/// one job whose spaces hold different templates have rows of different layouts).
pub(crate) type PriorKey = (JobId, Vec<u32>);

/// One workload's search.
pub(crate) struct Search {
    tuner: Arc<dyn Tuner>,
    /// Configs that have a task (in any state), mirroring the tasks table.
    taken: HashSet<Point>,
    /// Outcomes of its finished trials, in the order they finished (the `trial` column).
    observed: Vec<Observed>,
    /// A proposal made off the writer lock ([`Search::start_ahead`]): being computed, or ready to
    /// become tasks.
    ahead: Option<Ahead>,
    /// Tells this search from a later one of the same workload (reloaded after a failed write, or
    /// after another tracker changed the workload): a proposal computed for one is not given to
    /// the other.
    generation: u64,
}

/// A model tuner's proposal made off the writer lock.
enum Ahead {
    /// Being computed, for this many configs (counted as outstanding meanwhile, so that the
    /// workload gets no second batch and a job's budget is not handed out twice).
    Computing(usize),
    /// Computed: the configs, in the tuner's order.
    Ready(Vec<Point>),
}

/// What [`Search::start_ahead`] hands to a blocking thread: the tuner and copies of what it
/// proposes from.
pub(crate) struct AheadWork {
    tuner: Arc<dyn Tuner>,
    observed: Vec<Observed>,
    taken: HashSet<Point>,
    n: usize,
    /// The search it is for ([`Search::deliver`]).
    pub(crate) generation: u64,
}

impl AheadWork {
    /// The proposal (CPU work: call it on a blocking thread).
    pub(crate) fn run(self) -> Vec<Point> {
        self.tuner.propose(&self.observed, &Taken { committed: &self.taken, pending: None }, self.n)
    }
}

/// Numbers searches ([`Search::generation`]).
static GENERATIONS: AtomicU64 = AtomicU64::new(1);

impl Search {
    /// A search with `tuner` that continues after the configs in `taken`, whose finished trials
    /// measured `observed`.
    pub(crate) fn new(
        tuner: Arc<dyn Tuner>,
        taken: impl IntoIterator<Item = Point>,
        observed: Vec<Observed>,
    ) -> Search {
        Search {
            tuner,
            taken: taken.into_iter().collect(),
            observed,
            ahead: None,
            generation: GENERATIONS.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Whether its tuner's proposals are CPU work (a model fit), made off the writer lock.
    pub(crate) fn proposes_ahead(&self) -> bool {
        self.tuner.blocking()
    }

    /// How many configs a proposal made off the lock holds or will hold (0 without one): they
    /// count as outstanding.
    pub(crate) fn ahead(&self) -> usize {
        match &self.ahead {
            None => 0,
            Some(Ahead::Computing(n)) => *n,
            Some(Ahead::Ready(points)) => points.len(),
        }
    }

    /// Whether a proposal is being computed off the lock.
    pub(crate) fn computing(&self) -> bool {
        matches!(self.ahead, Some(Ahead::Computing(_)))
    }

    /// Whether a proposal computed off the lock waits to become tasks.
    pub(crate) fn ready(&self) -> bool {
        matches!(self.ahead, Some(Ahead::Ready(_)))
    }

    /// The ready proposal, up to `n` of its configs that have no task yet (none in `pending`
    /// either: empty when none is still free); `None` when none is ready.
    pub(crate) fn take_ready(&mut self, pending: Option<&HashSet<Point>>, n: usize) -> Option<Vec<Point>> {
        if !self.ready() {
            return None;
        }
        let Some(Ahead::Ready(points)) = self.ahead.take() else { return None };
        let taken = Taken { committed: &self.taken, pending };
        Some(points.into_iter().filter(|p| !taken.contains(*p)).take(n).collect())
    }

    /// Forgets a ready proposal that will not become tasks (its workload's budget went elsewhere).
    pub(crate) fn drop_ready(&mut self) {
        if self.ready() {
            self.ahead = None;
        }
    }

    /// Starts a proposal of `n` configs off the lock from the outcomes so far plus `fresh`, around
    /// the configs taken so far plus `pending`: what a blocking thread computes. The search
    /// counts `n` as outstanding until [`Search::deliver`] hands it the configs.
    pub(crate) fn start_ahead(&mut self, pending: Option<&HashSet<Point>>, fresh: &[Observed], n: usize) -> AheadWork {
        self.ahead = Some(Ahead::Computing(n));
        let mut taken = self.taken.clone();
        taken.extend(pending.into_iter().flatten().copied());
        AheadWork {
            tuner: Arc::clone(&self.tuner),
            observed: self.observations(fresh).collect(),
            taken,
            n,
            generation: self.generation,
        }
    }

    /// Forgets a proposal started off the lock that could not be handed over for computing.
    pub(crate) fn cancel_ahead(&mut self) {
        if self.computing() {
            self.ahead = None;
        }
    }

    /// Hands the search the configs computed for it off the lock; false (and nothing changes)
    /// when they were computed for another search of the workload or none is awaited.
    pub(crate) fn deliver(&mut self, generation: u64, points: Vec<Point>) -> bool {
        if generation != self.generation || !self.computing() {
            return false;
        }
        self.ahead = Some(Ahead::Ready(points));
        true
    }

    /// Up to `n` configs to propose next, skipping those taken and those in `pending` (proposed in
    /// a write that has not committed yet), given the outcomes so far plus `fresh` (finished in
    /// that write). A tuner whose proposals are CPU work runs on a blocking thread, on copies.
    pub(crate) async fn propose(
        &self,
        pending: Option<&HashSet<Point>>,
        fresh: &[Observed],
        n: usize,
    ) -> Result<Vec<Point>> {
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

    /// The tuner's chance that an untried config is >= 2% faster than the fastest of the outcomes
    /// so far and `fresh` (on a blocking thread: it fits models).
    pub(crate) async fn chance(&self, fresh: &[Observed]) -> Result<Option<f64>> {
        let tuner = Arc::clone(&self.tuner);
        let observed: Vec<Observed> = self.observations(fresh).collect();
        Ok(tokio::task::spawn_blocking(move || tuner.chance(&observed)).await?)
    }

    /// The outcomes so far, then `fresh`.
    pub(crate) fn observations<'a>(&'a self, fresh: &'a [Observed]) -> impl Iterator<Item = Observed> + 'a {
        self.observed.iter().chain(fresh).copied()
    }

    /// Marks configs as having a task (after the write that created them committed).
    pub(crate) fn take(&mut self, configs: impl IntoIterator<Item = Point>) {
        self.taken.extend(configs);
    }

    /// Adds outcomes of finished trials (after the write that stored them committed).
    pub(crate) fn observe(&mut self, outcomes: impl IntoIterator<Item = Observed>) {
        self.observed.extend(outcomes);
    }
}

/// The searches of every running workload, and the transfer priors of each job that has them.
#[derive(Default)]
pub(crate) struct Searches {
    map: HashMap<SearchKey, Search>,
    /// One per job and layout (its templates), shared by its workloads' model tuners; kept here so
    /// that a workload whose search is reloaded (after a restart or a failed write) does not
    /// rebuild it.
    priors: HashMap<PriorKey, Arc<Prior>>,
    /// On PostgreSQL, where trackers share the tables: the `job_workloads.version` each loaded
    /// search mirrors (see `Tracker::write`).
    versions: HashMap<SearchKey, i64>,
    /// The tuners of searches dropped because another tracker changed their workload: a tuner
    /// depends only on what never changes (space, seed, prior), so a reload reuses it.
    stale: HashMap<SearchKey, Arc<dyn Tuner>>,
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
        self.stale.remove(&key);
        self.map.insert(key, search);
    }

    /// A transfer prior of a job, if built.
    pub(crate) fn prior(&self, key: &PriorKey) -> Option<Arc<Prior>> {
        self.priors.get(key).cloned()
    }

    /// Keeps a transfer prior of a job.
    pub(crate) fn insert_prior(&mut self, key: PriorKey, prior: Arc<Prior>) {
        self.priors.insert(key, prior);
    }

    /// Forgets the searches of a workload (it stopped) or of a whole job (`idx` `None`, with its
    /// prior).
    pub(crate) fn remove(&mut self, job: JobId, idx: Option<u32>) {
        self.map.retain(|(j, i), _| *j != job || idx.is_some_and(|idx| idx != *i));
        self.stale.retain(|(j, i), _| *j != job || idx.is_some_and(|idx| idx != *i));
        if idx.is_none() {
            self.priors.retain(|(j, _), _| *j != job);
        }
    }

    /// Forgets every search whose workload's version in the database is not the one it mirrors
    /// (another tracker changed the workload's tasks since): it is reloaded when next needed.
    pub(crate) fn keep_current(&mut self, current: &HashMap<SearchKey, i64>) {
        let (versions, stale) = (&self.versions, &mut self.stale);
        self.map.retain(|key, search| {
            let fresh = versions.get(key).is_some_and(|v| current.get(key) == Some(v));
            if !fresh && current.contains_key(key) {
                stale.insert(*key, Arc::clone(&search.tuner));
            }
            fresh
        });
        self.versions.retain(|key, _| self.map.contains_key(key));
        self.stale.retain(|key, _| current.contains_key(key));
    }

    /// The tuner of a search dropped by [`Searches::keep_current`], for its reload.
    pub(crate) fn stale_tuner(&self, key: SearchKey) -> Option<Arc<dyn Tuner>> {
        self.stale.get(&key).cloned()
    }

    /// Notes the database version of workload `key` that its search now mirrors.
    pub(crate) fn set_version(&mut self, key: SearchKey, version: i64) {
        self.versions.insert(key, version);
    }

    /// Forgets everything written by a write that failed: it is reloaded from the database.
    pub(crate) fn remove_keys(&mut self, keys: impl IntoIterator<Item = SearchKey>, priors: &[PriorKey]) {
        for key in keys {
            self.map.remove(&key);
        }
        for key in priors {
            self.priors.remove(key);
        }
    }
}

/// Why no template of a job contributes a config to a workload: each template's reason, in slot
/// order (the name of the template and its objection).
pub(crate) type Rejections = Vec<(&'static str, Rejection)>;

/// One template's objection to a workload.
#[derive(Debug)]
pub(crate) enum Rejection {
    /// It does not take the workload on this device (op, types, layout, alignment, arch).
    Unsupported(tensortune_kernels::Error),
    /// It takes it, but none of its configs is valid on the device.
    NoValidConfig,
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejection::Unsupported(e) => write!(f, "{e}"),
            Rejection::NoValidConfig => f.write_str("no config of its space is valid on this device class"),
        }
    }
}

/// The space of one workload across `templates` (a job's list, in slot order) on `target`: every
/// valid config of each template that takes the workload, as [`Point`]s, and, with `features`,
/// each one's candidate (feature row in the layout of the templates that contribute, knob
/// positions, analytic time). A template that rejects the workload contributes nothing; `Err`
/// when none contributes, with each one's reason.
fn space(
    templates: &[&'static dyn Template],
    w: &Workload,
    target: &Target,
    features: bool,
) -> Result<std::result::Result<WorkloadSpace, Rejections>> {
    let mut parts: Vec<(u32, &'static dyn Template, Vec<u64>)> = Vec::new();
    let mut rejections = Rejections::new();
    for (slot, template) in templates.iter().enumerate() {
        if template.op() != w.op() {
            continue;
        }
        match template.valid_indices(w, target) {
            Err(e) => rejections.push((template.name(), Rejection::Unsupported(e))),
            Ok(valid) if valid.is_empty() => rejections.push((template.name(), Rejection::NoValidConfig)),
            Ok(valid) => parts.push((slot as u32, *template, valid)),
        }
    }
    if parts.is_empty() {
        return Ok(Err(rejections));
    }
    let valid: Arc<[Point]> =
        parts.iter().flat_map(|(slot, _, valid)| valid.iter().map(|&i| Point::new(*slot, i))).collect();
    let mut union_layout = None;
    let candidates = if features {
        let mut rows = Vec::with_capacity(valid.len());
        let mut widths = Vec::with_capacity(parts.len());
        for (_, template, valid) in &parts {
            let own = candidates(*template, w, target, valid)?;
            widths.push(own[0].features.len() - features::WORKLOAD_FEATURES.len());
            rows.push(own);
        }
        let layout = UnionLayout::new(widths);
        let several = parts.len() > 1;
        union_layout = Some(layout.clone());
        let mut out = Vec::with_capacity(valid.len());
        for (pos, own) in rows.into_iter().enumerate() {
            for mut c in own {
                if several {
                    c.features = layout.embed(pos, &c.features).ok_or_else(|| {
                        Error::Internal(format!("a feature row of {} has a width of its own", parts[pos].1.name()))
                    })?;
                    // The template is a knob too: configs of different templates are never
                    // near-copies of each other.
                    c.knobs.insert(0, pos);
                    c.group = pos;
                }
                out.push(c);
            }
        }
        Some(out.into())
    } else {
        None
    };
    Ok(Ok(WorkloadSpace { valid, candidates, layout: union_layout }))
}

/// The slots of the templates that contribute to a space (ascending).
pub(crate) fn slots_of(space: &WorkloadSpace) -> Vec<u32> {
    let mut slots: Vec<u32> = space.valid.iter().map(|p| p.slot).collect();
    slots.dedup();
    slots
}

/// The space of each of `workloads` across `templates` on `target` (see [`space`]): per workload,
/// its space or every template's objection. Computed on a blocking thread (a space has hundreds of
/// thousands of points); identical workloads are computed once.
pub(crate) async fn spaces(
    templates: Vec<&'static dyn Template>,
    workloads: Vec<Workload>,
    target: Target,
    features: bool,
) -> Result<Vec<std::result::Result<WorkloadSpace, Rejections>>> {
    let task = tokio::task::spawn_blocking(move || {
        let mut by_key: HashMap<String, WorkloadSpace> = HashMap::new();
        let mut out = Vec::with_capacity(workloads.len());
        for w in &workloads {
            let key = w.key();
            if let Some(s) = by_key.get(&key) {
                out.push(Ok(s.clone()));
                continue;
            }
            let space = space(&templates, w, &target, features)?;
            if let Ok(space) = &space {
                by_key.insert(key, space.clone());
            }
            out.push(space);
        }
        Ok(out)
    });
    task.await?
}

/// The candidates of a model search over one template: each of `valid` with its feature row.
fn candidates(template: &dyn Template, w: &Workload, target: &Target, valid: &[u64]) -> Result<Vec<Candidate>> {
    let space = template.space();
    valid
        .iter()
        .map(|&index| {
            let config = space.config(index).map_err(|e| features_error(template, w, index, &e))?;
            let knobs = space.positions(&config).map_err(|e| features_error(template, w, index, &e))?;
            let (features, analytic_us) =
                features::row(template, w, &config, target).map_err(|e| features_error(template, w, index, &e))?;
            Ok(Candidate { index, features, knobs, analytic_us, group: 0 })
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

/// A model's transfer prior from stored records (the store's `prior_records` of each template in
/// `templates`, read per template: other workloads of the device class, template and version),
/// in `layout` (the space's, whose templates are `templates` in this order), for a job whose
/// workloads are `tuned`; computed on a blocking thread. Each workload's records, across the
/// templates, are one group (so that one template's configs can be learned to be faster than
/// another's): per config its fastest ok time, or a failure when none was ok. Only what a model
/// for one of `tuned` can train on gets a feature row (`Prior::selection`: the workloads nearest
/// each, at most so many rows of each), so the cost does not grow with the store. Configs that a
/// template's current space does not know any more, and workloads that do not parse, are skipped,
/// and so is a workload whose records are of part of the templates another's are of
/// (`tuner::covering`: its times are relative to a best over part of the space).
pub(crate) async fn prior(
    templates: Vec<(&'static dyn Template, Vec<PriorRecord>)>,
    layout: UnionLayout,
    target: Target,
    tuned: Vec<Workload>,
) -> Result<Prior> {
    let task = tokio::task::spawn_blocking(move || {
        // Ordered maps: the prior's row order (and so the model fitted on it) must not depend on
        // hashing, or a restarted tracker would propose differently.
        type Group = (Workload, BTreeMap<(usize, String), Option<f64>>);
        let mut groups: BTreeMap<String, Group> = BTreeMap::new();
        for (pos, (_, records)) in templates.iter().enumerate() {
            for r in records {
                let ok = (r.status == Status::Ok && r.median_us > 0.0).then_some(r.median_us);
                let (_, configs) =
                    groups.entry(r.workload_key.clone()).or_insert_with(|| (r.workload.0, BTreeMap::new()));
                let slot = configs.entry((pos, r.config.clone())).or_insert(None);
                *slot = match (*slot, ok) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
        }
        // A workload measured with part of the space that another was measured with more of
        // is left out (`tuner::covering` says why); the replay builds its priors the same way.
        let holds: Vec<Vec<bool>> = groups
            .values()
            .map(|(_, configs)| (0..templates.len()).map(|pos| configs.keys().any(|(p, _)| *p == pos)).collect())
            .collect();
        let keep = tensortune_search::tuner::covering(&holds);
        let groups: Vec<Group> = groups.into_values().zip(keep).filter_map(|(g, keep)| keep.then_some(g)).collect();
        let sources: Vec<[f64; 7]> = groups.iter().map(|(w, _)| features::workload_row(w)).collect();
        let tuned: Vec<[f64; 7]> = tuned.iter().map(features::workload_row).collect();
        let spaces: Vec<_> = templates.iter().map(|(t, _)| t.space()).collect();
        let picked = tensortune_search::tuner::nearest(&sources, &tuned, tensortune_search::tuner::PRIOR_WORKLOADS);
        let target_key = row_target_key(&target);
        // A feature row each, one thread per workload (thousands of rows each), in their order;
        // rows featurised for an earlier prior in this process come from `ROW_CACHE`.
        let featurize = |g: usize| {
            let (workload, configs) = &groups[g];
            // Each config (the map's order: by template, then config) whose template's space
            // holds it, with its row (`None`: it has none).
            let mut known: Vec<(usize, Row, Option<f64>)> = Vec::with_capacity(configs.len());
            for (pos, (template, _)) in templates.iter().enumerate() {
                let mine: Vec<(&String, Option<f64>)> =
                    configs.iter().filter(|((p, _), _)| *p == pos).map(|((_, c), t)| (c, *t)).collect();
                if mine.is_empty() {
                    continue;
                }
                let found = rows_of(*template, &spaces[pos], workload, &target, &target_key, mine.iter().map(|m| m.0));
                known.extend(found.into_iter().zip(&mine).filter_map(|(row, m)| Some((pos, row?, m.1))));
            }
            let times: Vec<Option<f64>> = known.iter().map(|k| k.2).collect();
            let keep = tensortune_search::tuner::capped(
                &tensortune_search::model::normalise_transfer(&times),
                tensortune_search::tuner::PRIOR_ROWS_PER_WORKLOAD,
            );
            let mut rows = Vec::with_capacity(keep.len());
            let mut kept = Vec::with_capacity(keep.len());
            for (pos, row, time) in keep.into_iter().map(|i| &known[i]) {
                let Some(row) = row else { continue };
                let Some(row) = layout.embed(*pos, row) else { continue };
                rows.push(row);
                kept.push(*time);
            }
            (features::workload_row(workload), rows, kept)
        };
        let featurize = &featurize;
        let parts: Vec<_> = std::thread::scope(|scope| {
            let threads: Vec<_> = picked.iter().map(|&g| scope.spawn(move || featurize(g))).collect();
            threads.into_iter().map(|t| t.join()).collect()
        });
        let mut prior = Prior::default();
        for part in parts {
            let (source, rows, kept) =
                part.map_err(|_| Error::Internal("a thread computing prior features panicked".to_owned()))?;
            if !rows.is_empty() {
                prior.extend(source, rows, &kept);
            }
        }
        Ok(prior)
    });
    task.await?
}

/// A prior workload's rows of one template: per config (its JSON), `None` when the template's
/// space does not hold it, else its feature row (`None`: it has none).
type GroupRows = HashMap<String, Option<Row>>;

/// A config's feature row, `None` when it has none.
type Row = Option<Arc<[f64]>>;

/// Which rows [`ROW_CACHE`] holds: the target (its `Debug` form), template, version and the
/// prior workload's key.
type RowKey = (String, &'static str, u32, String);

/// Feature rows of prior records featurised in this process: a record's row depends only on its
/// workload, template, config and the target, not on the job, so the jobs of one bench (one job
/// per workload) featurise the shipped packs once (about 0.4 s of 16 cores a job on an H200,
/// 2026-11-28). Emptied when it would hold more than [`ROW_CACHE_ROWS`].
static ROW_CACHE: std::sync::Mutex<Option<RowCache>> = std::sync::Mutex::new(None);

/// [`ROW_CACHE`]'s rows by key, and how many it holds.
type RowCache = (HashMap<RowKey, Arc<GroupRows>>, usize);

/// Most rows [`ROW_CACHE`] holds (about 0.5 KB each): several times the shipped packs' records of
/// one architecture.
const ROW_CACHE_ROWS: usize = 400_000;

/// The cached rows of `key` (empty when none).
fn cached_rows(key: &RowKey) -> Arc<GroupRows> {
    let cache = ROW_CACHE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    cache.as_ref().and_then(|(map, _)| map.get(key).cloned()).unwrap_or_default()
}

/// The part of [`RowKey`] that names `target`.
fn row_target_key(target: &Target) -> String {
    format!("{target:?}")
}

/// For each of `configs` (JSON) of `template` (whose space is `space`) measured on prior workload
/// `workload`: `None` when the space does not hold it, else its feature row on `target` (`None`:
/// it has none); from [`ROW_CACHE`], those not there computed and kept.
fn rows_of<'a>(
    template: &'static dyn Template,
    space: &tensortune_kernels::Space,
    workload: &Workload,
    target: &Target,
    target_key: &str,
    configs: impl Iterator<Item = &'a String>,
) -> Vec<Option<Row>> {
    let key = (target_key.to_owned(), template.name(), template.version(), workload.key());
    let cached = cached_rows(&key);
    let mut fresh = GroupRows::new();
    let out = configs
        .map(|config| match cached.get(config) {
            Some(found) => found.clone(),
            None => {
                let found = Config::from_json(config)
                    .ok()
                    .filter(|c| space.index_of(c).is_ok())
                    .map(|c| features::row(template, workload, &c, target).ok().map(|(row, _)| row.into()));
                fresh.insert(config.clone(), found.clone());
                found
            }
        })
        .collect();
    if !fresh.is_empty() {
        keep_rows(key, fresh);
    }
    out
}

/// Computes into [`ROW_CACHE`] the rows of `records` (each with the position of its template in
/// `templates`) on `target`, a thread per prior workload and template: what a model job's transfer
/// prior reads (the shipped packs' records), done while its space is enumerated, so that the
/// prior then takes them from the cache.
pub(crate) fn warm_rows(templates: &[&'static dyn Template], records: Vec<(usize, PriorRecord)>, target: &Target) {
    let target_key = row_target_key(target);
    let mut groups: BTreeMap<(usize, String), (Workload, Vec<String>)> = BTreeMap::new();
    for (pos, r) in records {
        groups.entry((pos, r.workload_key)).or_insert_with(|| (r.workload.0, Vec::new())).1.push(r.config);
    }
    let spaces: Vec<_> = templates.iter().map(|t| t.space()).collect();
    let (spaces, target_key) = (&spaces, &target_key);
    std::thread::scope(|scope| {
        for ((pos, _), (prior_workload, configs)) in &groups {
            let template = templates[*pos];
            scope.spawn(move || rows_of(template, &spaces[*pos], prior_workload, target, target_key, configs.iter()));
        }
    });
}

/// Adds `rows` to the cached rows of `key`.
fn keep_rows(key: RowKey, rows: GroupRows) {
    let mut cache = ROW_CACHE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let (map, count) = cache.get_or_insert_with(Default::default);
    if *count + rows.len() > ROW_CACHE_ROWS {
        map.clear();
        *count = 0;
    }
    *count += rows.len();
    let entry = map.entry(key).or_default();
    let mut merged = GroupRows::clone(entry);
    merged.extend(rows);
    *entry = Arc::new(merged);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tuner::TunerKind;

    fn grid(valid: &Arc<[Point]>) -> Arc<dyn Tuner> {
        let space = WorkloadSpace { valid: Arc::clone(valid), candidates: None, layout: None };
        TunerKind::Grid.build(&space, 1, 0, None).unwrap()
    }

    #[tokio::test]
    async fn pending_proposals_are_skipped_and_taken_after_commit() {
        let p = |i| Point::new(0, i);
        let valid: Arc<[Point]> = (0..10u64).map(p).collect();
        let mut s = Search::new(grid(&valid), [p(0), p(1)], Vec::new());
        let pending: HashSet<Point> = [p(2)].into();
        assert_eq!(s.propose(Some(&pending), &[], 2).await.unwrap(), vec![p(3), p(4)]);
        s.take([p(2), p(3), p(4)]);
        assert_eq!(s.propose(None, &[], 100).await.unwrap(), [5, 6, 7, 8, 9].map(p));
        s.observe([Observed { config: p(0), time_us: Some(3.0) }]);
        let fresh = [Observed { config: p(1), time_us: None }];
        assert_eq!(s.observations(&fresh).map(|o| o.config).collect::<Vec<_>>(), [p(0), p(1)]);
    }

    #[test]
    fn a_proposal_off_the_lock_counts_as_outstanding_and_reaches_only_its_own_search() {
        let p = |i| Point::new(0, i);
        let valid: Arc<[Point]> = (0..10u64).map(p).collect();
        let mut s = Search::new(grid(&valid), [p(0)], Vec::new());
        let pending: HashSet<Point> = [p(1)].into();
        let work = s.start_ahead(Some(&pending), &[Observed { config: p(0), time_us: Some(2.0) }], 3);
        assert!(s.computing() && !s.ready());
        assert_eq!(s.ahead(), 3, "what is being computed counts as outstanding");
        assert_eq!(s.take_ready(None, 3), None, "nothing is ready while it is computed");
        let generation = work.generation;
        // Computed from copies: what was taken (committed and pending) is not proposed again.
        let points = work.run();
        assert_eq!(points, [p(2), p(3), p(4)]);
        // A reloaded search of the same workload does not take another search's proposal.
        let mut reloaded = Search::new(grid(&valid), [p(0)], Vec::new());
        assert!(!reloaded.deliver(generation, points.clone()));
        assert_eq!(reloaded.ahead(), 0);
        assert!(s.deliver(generation, points.clone()));
        assert!(s.ready() && !s.deliver(generation, points), "a proposal is handed over once");
        // A config that got a task meanwhile is left out, and no more than asked for is taken.
        s.take([p(3)]);
        assert_eq!(s.take_ready(None, 1), Some(vec![p(2)]));
        assert_eq!((s.ahead(), s.take_ready(None, 5)), (0, None), "a ready proposal is taken once");
        let _ = s.start_ahead(None, &[], 2);
        s.cancel_ahead();
        assert_eq!(s.ahead(), 0);
    }

    #[tokio::test]
    async fn a_prior_built_again_from_cached_rows_is_the_same() {
        use tensortune_kernels::registry::by_name;
        use tensortune_kernels::{DType, Layout, Matmul, Types};
        let template = by_name("wmma_gemm").unwrap();
        let matmul = |m, n, k| {
            Workload::Matmul(Matmul::new(m, n, k, Layout::Nn, Types::default_for(DType::F16).unwrap()).unwrap())
        };
        let (source, tuned, target) = (matmul(384, 96, 640), matmul(256, 128, 256), Target::sm90());
        let valid = tensortune_kernels::template::valid_configs(template, &source, &target).unwrap();
        let records: Vec<PriorRecord> = valid
            .iter()
            .take(40)
            .enumerate()
            .map(|(i, (_, c))| PriorRecord {
                workload_key: source.key(),
                workload: crate::store::Json(source),
                config: c.to_json(),
                status: if i % 7 == 3 { Status::CompileError } else { Status::Ok },
                median_us: 1.0 + i as f64 / 10.0,
            })
            .chain(std::iter::once(PriorRecord {
                workload_key: source.key(),
                workload: crate::store::Json(source),
                config: "{\"no_such_knob\":1}".to_owned(),
                status: Status::Ok,
                median_us: 0.5,
            }))
            .collect();
        let layout = space(&[template], &tuned, &target, true).unwrap().unwrap().layout.unwrap();
        let build = || prior(vec![(template, records.clone())], layout.clone(), target.clone(), vec![tuned]);
        let (first, again) = (build().await.unwrap(), build().await.unwrap());
        // 40 known configs (the unknown one is left out), the same rows and targets both times.
        assert_eq!(first.rows.len(), 40);
        assert_eq!((first.rows.clone(), first.y.clone()), (again.rows, again.y));
    }

    #[tokio::test]
    async fn a_union_prior_leaves_out_a_workload_measured_with_one_of_its_templates() {
        use tensortune_kernels::registry::by_name;
        use tensortune_kernels::{DType, Layout, Matmul, Types};
        let (wmma, wgmma) = (by_name("wmma_gemm").unwrap(), by_name("wgmma_gemm").unwrap());
        let matmul = |m, n, k| {
            Workload::Matmul(Matmul::new(m, n, k, Layout::Nn, Types::default_for(DType::F16).unwrap()).unwrap())
        };
        let (both, wmma_only, tuned, target) =
            (matmul(384, 96, 640), matmul(512, 128, 512), matmul(256, 128, 256), Target::sm90());
        let records = |template: &'static dyn Template, source: Workload, n: usize| -> Vec<PriorRecord> {
            let valid = tensortune_kernels::template::valid_configs(template, &source, &target).unwrap();
            valid
                .iter()
                .take(n)
                .enumerate()
                .map(|(i, (_, c))| PriorRecord {
                    workload_key: source.key(),
                    workload: crate::store::Json(source),
                    config: c.to_json(),
                    status: Status::Ok,
                    median_us: 1.0 + i as f64 / 10.0,
                })
                .collect()
        };
        let space = space(&[wmma, wgmma], &tuned, &target, true).unwrap().unwrap();
        assert_eq!(slots_of(&space), [0, 1]);
        let layout = space.layout.unwrap();
        let build = |parts| prior(parts, layout.clone(), target.clone(), vec![tuned]);
        let mut of_wmma = records(wmma, both, 30);
        of_wmma.extend(records(wmma, wmma_only, 20));
        let of_wgmma = records(wgmma, both, 25);
        // The workload of wmma_gemm alone is left out, every row of it: only the other's 55.
        let union = build(vec![(wmma, of_wmma.clone()), (wgmma, of_wgmma)]).await.unwrap();
        assert_eq!(union.rows.len(), 55);
        assert!(union.sources.iter().all(|s| *s == features::workload_row(&both)));
        // Where no workload has wgmma_gemm records, it demands nothing: both workloads' 50.
        let partial = build(vec![(wmma, of_wmma), (wgmma, Vec::new())]).await.unwrap();
        assert_eq!(partial.rows.len(), 50);
    }

    /// A fresh tracker's prior (the shipped packs) for a union-v14 matmul holds the rows the replay's
    /// cold start trains on (`search/tests/union_replay.rs`), so that the replay's figures are
    /// the tracker's: the same workloads (the older packs' wmma-only ones left out by both), rows
    /// and targets.
    #[tokio::test]
    async fn a_fresh_tracker_s_prior_is_the_replay_s_cold_start() {
        use tensortune_kernels::registry::by_name;
        use tensortune_search::replay::Dataset;
        let class = "nvidia-h200/sm90/132sm";
        let key = "matmul/m1024n256k2048/tn/f16,f32,f16/alpha=1,beta=0";
        let (tuned, target) = (Workload::from_key(key).unwrap(), features::target_for_class(class));
        let templates = [by_name("wmma_gemm").unwrap(), by_name("wgmma_gemm").unwrap()];
        let space = space(&templates, &tuned, &target, true).unwrap().unwrap();
        assert_eq!(slots_of(&space), [0, 1]);
        let shipped = crate::packs::shipped();
        let parts = templates
            .iter()
            .map(|t| {
                (
                    *t,
                    crate::packs::shipped_prior(shipped, *t, class, &[key.to_owned()])
                        .into_iter()
                        .map(|r| r.1)
                        .collect(),
                )
            })
            .collect();
        let ours = prior(parts, space.layout.unwrap(), target, vec![tuned]).await.unwrap();
        // Every shipped file of matmuls (the conv pack adds nothing to a matmul's prior).
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../search/testdata");
        let files: Vec<_> = crate::packs::SHIPPED
            .iter()
            .map(|(name, _)| dir.join(format!("{}.jsonl.gz", name.trim_start_matches("shipped:"))))
            .filter(|f| !f.to_string_lossy().contains("conv2d"))
            .collect();
        let data = Dataset::load_all(&files).unwrap();
        let replay = data.prior_for(data.workloads.iter().find(|w| w.key == key).unwrap());
        // Compared as sets of (workload, row, target), bit for bit (missing columns are NaN).
        let rows = |p: &Prior| {
            let mut out: Vec<(Vec<u64>, Vec<u64>, u64)> = (0..p.rows.len())
                .map(|i| {
                    (
                        p.sources[i].map(f64::to_bits).to_vec(),
                        p.rows[i].iter().map(|x| x.to_bits()).collect(),
                        p.y[i].to_bits(),
                    )
                })
                .collect();
            out.sort();
            out
        };
        let workloads = |p: &Prior| p.sources.iter().map(|s| s.map(f64::to_bits)).collect::<HashSet<_>>().len();
        assert_eq!((workloads(&ours), workloads(&replay)), (31, 31), "the other union-v14 and union-v19 matmuls");
        assert_eq!(ours.rows.len(), replay.rows.len());
        assert!(rows(&ours) == rows(&replay), "the tracker's and the replay's rows differ");
    }

    #[test]
    fn removing_a_job_keeps_other_jobs() {
        let valid: Arc<[Point]> = (0..10u64).map(|i| Point::new(0, i)).collect();
        let mut all = Searches::default();
        for key in [(1, 0), (1, 1), (2, 0)] {
            all.insert(key, Search::new(grid(&valid), [], Vec::new()));
        }
        all.insert_prior((1, vec![0]), Arc::new(Prior::default()));
        all.insert_prior((1, vec![0, 1]), Arc::new(Prior::default()));
        all.insert_prior((2, vec![0]), Arc::new(Prior::default()));
        all.remove(1, Some(1));
        assert!(all.get((1, 0)).is_some() && all.get((1, 1)).is_none() && all.prior(&(1, vec![0, 1])).is_some());
        all.remove(1, None);
        assert!(all.get((1, 0)).is_none() && all.get((2, 0)).is_some());
        assert!(all.prior(&(1, vec![0])).is_none() && all.prior(&(1, vec![0, 1])).is_none());
        assert!(all.prior(&(2, vec![0])).is_some());
    }

    #[test]
    fn a_union_space_holds_every_template_that_takes_the_workload() {
        use tensortune_kernels::registry::templates_for;
        use tensortune_kernels::{DType, Layout, Matmul, Op, Types};
        let templates = templates_for(Op::Matmul);
        assert_eq!(
            templates.iter().map(|t| t.name()).collect::<Vec<_>>(),
            ["wmma_gemm", "wgmma_gemm", "simt_gemm", "mma_ext_gemm"]
        );
        let matmul = |layout, input| {
            Workload::Matmul(Matmul::new(256, 128, 256, layout, Types::default_for(input).unwrap()).unwrap())
        };
        let f16 = space(&templates, &matmul(Layout::Nn, DType::F16), &Target::sm90(), true).unwrap().unwrap();
        assert_eq!(slots_of(&f16), [0, 1]);
        let candidates = f16.candidates.as_ref().unwrap();
        assert_eq!(candidates.len(), f16.valid.len());
        let width = f16.layout.as_ref().unwrap().width();
        for (p, c) in f16.valid.iter().zip(candidates.iter()) {
            assert_eq!(c.features.len(), width);
            assert_eq!((c.features[0], c.features[1]), if p.slot == 0 { (1.0, 0.0) } else { (0.0, 1.0) });
            assert_eq!(c.knobs[0], p.slot as usize);
            assert!(templates[p.slot as usize].space().config(p.index).is_ok());
        }
        // On sm_80 (no wgmma), or for i8 in nn (wgmma takes i8 in tn only), wmma_gemm alone, with
        // its own rows.
        let sm80 = space(&templates, &matmul(Layout::Nn, DType::F16), &Target::sm80(), true).unwrap().unwrap();
        assert_eq!(slots_of(&sm80), [0]);
        let i8 = space(&templates, &matmul(Layout::Nn, DType::I8), &Target::sm90(), false).unwrap().unwrap();
        assert_eq!(slots_of(&i8), [0]);
        // Exact f32 is simt_gemm's alone; tf32 and the packed types are mma_ext_gemm's.
        let f32 = space(&templates, &matmul(Layout::Nn, DType::F32), &Target::sm90(), false).unwrap().unwrap();
        assert_eq!(slots_of(&f32), [2]);
        let tf32 = space(&templates, &matmul(Layout::Nt, DType::Tf32), &Target::sm90(), false).unwrap().unwrap();
        assert_eq!(slots_of(&tf32), [3]);
        let wgmma_only = space(&templates[1..2], &matmul(Layout::Nn, DType::I8), &Target::sm90(), false).unwrap();
        let Err(rejections) = wgmma_only else { panic!("wgmma_gemm took i8 in nn") };
        assert!(
            matches!(&rejections[..], [("wgmma_gemm", Rejection::Unsupported(e))] if e.to_string().contains("layout"))
        );
    }

    #[test]
    fn an_exact_f32_conv_is_simt_conv2d_s_alone() {
        use tensortune_kernels::registry::templates_for;
        use tensortune_kernels::{Conv2d, DType, Op, Types};
        let templates = templates_for(Op::Conv2d);
        let names: Vec<_> = templates.iter().map(|t| t.name()).collect();
        assert_eq!(names, ["wmma_conv2d", "wgmma_conv2d", "simt_conv2d"]);
        let layer = |input, c| {
            Workload::Conv2d(Conv2d {
                n: 2,
                h: 14,
                w: 14,
                c,
                k: 64,
                r: 3,
                s: 3,
                pad: (1, 1),
                stride: (1, 1),
                dilation: (1, 1),
                types: Types::default_for(input).unwrap(),
                epilogue: Default::default(),
                residual: false,
            })
        };
        // Any channel count in f32 (an RGB stem too); f16 stays with the tensor-core templates.
        for c in [64, 3] {
            let f32 = space(&templates, &layer(DType::F32, c), &Target::sm90(), true).unwrap().unwrap();
            assert_eq!(slots_of(&f32), [2], "c = {c}");
            assert_eq!(f32.candidates.as_ref().unwrap().len(), f32.valid.len());
        }
        let f16 = space(&templates, &layer(DType::F16, 64), &Target::sm90(), false).unwrap().unwrap();
        assert_eq!(slots_of(&f16), [0, 1]);
    }
}
