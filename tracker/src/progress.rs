//! How a job advances inside a write: the tuner proposes tasks (reusing identical records), each
//! finished task updates its workload's progress, best and early-stopping state and feeds its
//! outcome to the search, a job with a trial budget shares it across its workloads by expected
//! gain, a workload whose tuning ended re-measures its finalists (`finalists.rs`), and a job whose
//! workloads all finished is done.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tensortune_kernels::{Space, Target, Template};
use tensortune_search::schedule::{self, TaskProgress};
use tensortune_search::tuner::Prior;

use crate::dispatch::Producer;
use crate::error::{Error, Result};
use crate::model::{
    JobId, JobState, Measurement, RecordId, Status, TaskId, TaskKind, TaskState, TemplateRef, WorkloadState,
};
use crate::search::{self, Search};
use crate::store::jobs::JobRow;
use crate::store::records::{ContentScope, NewRecord, Outcome, PriorRecord, PriorScope, TrialOutcome};
use crate::store::tasks::{Completion, NewTask, PendingTask, TaskRow};
use crate::store::workloads::WorkloadRow;
use crate::store::{self};
use crate::tracker::{Proposal, Tracker, Write};
use crate::tuner::{Observed, Point, TunerKind, WorkloadSpace};
use tensortune_kernels::energy::{self, Objective};

/// Most records a transfer prior is built from: enough for a model to learn the space's shape,
/// few enough that building it (a feature row each) and fitting on it stay quick.
pub(crate) const PRIOR_RECORDS: u32 = 4000;

/// A tuning record stored by [`Tracker::store_record`] whose task is not marked done yet.
pub(crate) struct Stored {
    workload_idx: u32,
    /// Whether its task was outstanding (pending or leased) until now.
    outstanding: bool,
    /// The record, inserted with the others (`Tracker::complete_stored`), which gives the trial's
    /// outcome its id.
    record: ResultRecord,
    trial: Trial,
}

/// What [`NewRecord`] borrows, owned: the record of a tuning report, kept until inserted.
struct ResultRecord {
    job_id: JobId,
    task_id: TaskId,
    worker_id: Option<crate::model::WorkerId>,
    workload: tensortune_kernels::Workload,
    template: String,
    template_version: u32,
    config: String,
    config_index: i64,
    device_class: String,
    measurement: Measurement,
    token_id: Option<i64>,
    untrusted: Option<String>,
}

impl ResultRecord {
    fn as_new(&self) -> NewRecord<'_> {
        NewRecord {
            task_id: self.task_id,
            job_id: self.job_id,
            worker_id: self.worker_id,
            workload: &self.workload,
            template: &self.template,
            template_version: self.template_version,
            config: &self.config,
            config_index: self.config_index,
            device_class: &self.device_class,
            measurement: &self.measurement,
            finalist: None,
            token_id: self.token_id,
            untrusted: self.untrusted.as_deref(),
        }
    }
}

/// A finished tuning task, as counted.
struct Trial {
    task: TaskId,
    config: Point,
    outcome: Outcome,
    /// Answered from an earlier identical record instead of measured.
    reused: bool,
    /// The trial number already stored with the task (with its completion), if it was.
    numbered: Option<u32>,
}

/// A stored trial outcome as the search sees it (`None` for a template the job does not search,
/// which its tasks never have).
/// What the search learns is the job's objective: the time, the energy or the energy x delay of
/// each trial (a trial without the energy an objective needs counts as failed).
fn as_observed(templates: &JobTemplates, objective: Objective, t: TrialOutcome) -> Option<Observed> {
    let ok = t.status == Status::Ok && t.trusted;
    let slot = templates.slot(&t.template, t.template_version)?;
    let config = Point::new(slot, u64::try_from(t.config_index).ok()?);
    Some(Observed { config, time_us: ok.then(|| objective.score(t.median_us, t.energy_mj)).flatten() })
}

/// The best time after each finished trial (infinite before the first ok one), then held for each
/// proposed trial not finished yet: `proposed` entries in all. Counting trials in flight as no
/// improvement keeps the scheduler's warm-up from handing one workload more than its share while
/// its results are pending, and tempers its gain by the work it already has.
fn best_after(observed: &[Observed], proposed: u32) -> Vec<f64> {
    let mut best = f64::INFINITY;
    let mut out: Vec<f64> = observed
        .iter()
        .map(|o| {
            best = o.time_us.map_or(best, |t| best.min(t));
            best
        })
        .collect();
    out.resize((proposed as usize).max(out.len()), best);
    out
}

/// How many of a batch tuner's proposals may still be outstanding when it is asked for its next
/// batch (`tensortune_search::tuner::lookahead`, which the replay of the search bars follows).
fn lookahead(batch_size: u32) -> u32 {
    u32::try_from(tensortune_search::tuner::lookahead(batch_size as usize)).unwrap_or(batch_size)
}

/// The median of `times`, `None` when empty.
fn median(mut times: Vec<f64>) -> Option<f64> {
    times.sort_by(f64::total_cmp);
    times.get(times.len() / 2).copied()
}

/// How many of `want` trials each of `running` gets: the next trial, or with `batches` the next
/// batch (the rest of `want`), goes to the workload `schedule::next` picks, and counts as in
/// flight. `progress[i].open` says whether workload `i` may take more.
fn allocate(mut progress: Vec<TaskProgress>, running: &[WorkloadRow], want: u32, batches: bool) -> Vec<u32> {
    let mut shares = vec![0u32; running.len()];
    let mut given = 0;
    while given < want {
        let Some(i) = schedule::next(&progress) else { break };
        let room = running[i].trials_target.saturating_sub(running[i].proposed + shares[i]);
        let n = if batches { (want - given).min(room) } else { 1 };
        shares[i] += n;
        given += n;
        let t = &mut progress[i];
        let last = t.best_after.last().copied().unwrap_or(f64::INFINITY);
        t.best_after.resize(t.best_after.len() + n as usize, last);
        t.open = !batches && running[i].proposed + shares[i] < running[i].trials_target;
    }
    shares
}

/// The templates a stored job searches, in slot order (a [`Point`]'s slot is a position here), as
/// built into this tracker.
pub(crate) struct JobTemplates(Vec<&'static dyn Template>);

impl JobTemplates {
    /// The templates of `job`; an error when one of them (at its version) is not built into this
    /// tracker any more.
    pub(crate) fn of(job: &JobRow) -> Result<JobTemplates> {
        let spelled = if job.templates.0.is_empty() {
            vec![format!("{}@{}", job.template, job.template_version)]
        } else {
            job.templates.0.clone()
        };
        let mut out = Vec::with_capacity(spelled.len());
        for s in &spelled {
            let t = TemplateRef::parse(s)
                .ok_or_else(|| Error::Internal(format!("job {} lists template {s:?}, not name@version", job.id)))?;
            let template = tensortune_kernels::registry::by_name(&t.name).map_err(|_| {
                Error::Precondition(format!("template {:?} is not built into this tracker; resubmit the job", t.name))
            })?;
            if template.version() != t.version {
                return Err(Error::Precondition(format!(
                    "job {} tunes {} v{}, but this tracker builds v{}; resubmit the job to tune the new version",
                    job.id,
                    t.name,
                    t.version,
                    template.version()
                )));
            }
            out.push(template);
        }
        Ok(JobTemplates(out))
    }

    /// Every template, in slot order.
    pub(crate) fn all(&self) -> &[&'static dyn Template] {
        &self.0
    }

    /// The template in `slot`.
    pub(crate) fn get(&self, slot: u32) -> Result<&'static dyn Template> {
        self.0.get(slot as usize).copied().ok_or_else(|| Error::Internal(format!("no template in slot {slot}")))
    }

    /// The slot of template `name` at `version`, if the job searches it.
    pub(crate) fn slot(&self, name: &str, version: u32) -> Option<u32> {
        self.0.iter().position(|t| t.name() == name && t.version() == version).map(|p| p as u32)
    }
}

impl Tracker {
    /// Workload `idx` of `job`, which must exist.
    /// Read once per write: later reads get the row as this write last stored it.
    pub(crate) async fn workload(&self, w: &mut Write<'_>, job: &JobRow, idx: u32) -> Result<WorkloadRow> {
        if let Some(row) = w.workload_row((job.id, idx)) {
            return Ok(row.clone());
        }
        let row = store::workloads::get(w.conn(), job.id, idx)
            .await?
            .ok_or_else(|| Error::Internal(format!("workload {idx} of job {} is missing from the store", job.id)))?;
        w.remember_workload(&row);
        Ok(row)
    }

    /// Sets job `id`'s `updated_ms` to this write's time, once per write.
    pub(crate) async fn touch_job(&self, w: &mut Write<'_>, id: JobId) -> Result<()> {
        if w.first_touch(id) {
            let now = w.now();
            store::jobs::touch(w.conn(), id, now).await?;
        }
        Ok(())
    }

    /// Loads the search of a workload if it is not in memory (after a restart, or a failed write):
    /// its space (with feature rows for a model), the configs that have a task, the outcomes of its
    /// finished trials in the order they finished, and for a model with transfer the job's prior.
    pub(crate) async fn ensure_search(&self, w: &mut Write<'_>, job: &JobRow, wl: &WorkloadRow) -> Result<()> {
        let key = (job.id, wl.idx);
        if w.search(key).is_some() {
            return Ok(());
        }
        let templates = JobTemplates::of(job)?;
        // Another tracker on the database changed this workload's tasks: its tuner (a function of
        // the space, seed and prior, which never change) is kept; what was taken and observed is
        // read again.
        if let Some(tuner) = w.stale_tuner(key) {
            let (taken, observed) = self.search_state(w, job, &templates, wl.idx).await?;
            w.insert_search(key, Search::new(tuner, taken, observed));
            return Ok(());
        }
        let target = store::classes::target(w.conn(), &job.device_class).await?.ok_or_else(|| {
            Error::Internal(format!("device class {:?} of job {} is missing from the store", job.device_class, job.id))
        })?;
        let features = job.tuner.needs_features();
        let started = std::time::Instant::now();
        // A model with transfer featurises the shipped packs' records while the space is
        // enumerated (the prior then reads their rows from a cache).
        let takes_shipped = crate::packs::takes_shipped(&job.device_class);
        let warm = (features && job.transfer && self.config.prior_pack && takes_shipped).then(|| {
            let (templates, workload, class, target) =
                (templates.all().to_vec(), wl.workload.0, job.device_class.clone(), target.clone());
            tokio::task::spawn_blocking(move || {
                let (shipped, exclude) = (crate::packs::shipped(), [workload.key()]);
                let records = templates
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| t.op() == workload.op())
                    .flat_map(|(pos, t)| {
                        crate::packs::shipped_prior(shipped, *t, &class, &exclude)
                            .into_iter()
                            .map(move |(_, r)| (pos, r))
                    })
                    .collect();
                search::warm_rows(&templates, records, &target)
            })
        });
        let spaces = search::spaces(templates.all().to_vec(), vec![wl.workload.0], target.clone(), features).await?;
        if let Some(warm) = warm {
            warm.await?;
        }
        let space = match spaces.into_iter().next() {
            Some(Ok(space)) => space,
            Some(Err(rejections)) => {
                let why: Vec<String> = rejections.iter().map(|(t, r)| format!("{t}: {r}")).collect();
                return Err(Error::Internal(format!(
                    "the space of workload {} of job {} cannot be enumerated: {}",
                    wl.idx,
                    job.id,
                    why.join("; ")
                )));
            }
            None => return Err(Error::Internal("a space was asked for and none came".to_owned())),
        };
        let space_ms = started.elapsed().as_millis() as u64;
        tracing::debug!(
            job = job.id,
            workload = wl.idx,
            configs = space.valid.len(),
            ms = space_ms,
            "search space built"
        );
        let prior = self.job_prior(w, job, &templates, &space, &target).await?;
        let (taken, observed) = self.search_state(w, job, &templates, wl.idx).await?;
        let tuner = job.tuner.build(&space, job.seed(), wl.idx, prior)?;
        w.insert_search(key, Search::new(tuner, taken, observed));
        Ok(())
    }

    /// The configs of workload `idx` that have a task, and the outcomes of its finished trials in
    /// the order they finished.
    async fn search_state(
        &self,
        w: &mut Write<'_>,
        job: &JobRow,
        templates: &JobTemplates,
        idx: u32,
    ) -> Result<(Vec<Point>, Vec<Observed>)> {
        let taken: Vec<Point> = store::tasks::taken(w.conn(), job.id, idx)
            .await?
            .into_iter()
            .filter_map(|(name, version, index)| Some(Point::new(templates.slot(&name, version)?, index as u64)))
            .collect();
        let observed = store::records::trial_outcomes(w.conn(), job.id, idx)
            .await?
            .into_iter()
            .filter_map(|t| as_observed(templates, job.objective(), t))
            .collect();
        Ok((taken, observed))
    }

    /// The transfer prior of a model job with transfer on (`None` otherwise) for a workload's
    /// `space`: built once per job and set of templates (the space's layout) from the stored tuning
    /// records of workloads outside the job on its device class, read per template and version,
    /// recorded before the job was submitted (so that a restarted tracker builds the same), the
    /// most recent [`PRIOR_RECORDS`] (shared evenly by the templates), mapped into the space's
    /// columns.
    pub(crate) async fn job_prior(
        &self,
        w: &mut Write<'_>,
        job: &JobRow,
        templates: &JobTemplates,
        space: &WorkloadSpace,
        target: &Target,
    ) -> Result<Option<Arc<Prior>>> {
        if job.tuner != TunerKind::Model || !job.transfer {
            return Ok(None);
        }
        let slots = search::slots_of(space);
        let key = (job.id, slots.clone());
        if let Some(prior) = w.prior(&key) {
            return Ok(Some(prior));
        }
        let layout = space
            .layout
            .clone()
            .ok_or_else(|| Error::Internal("a model search was built without its candidates' features".to_owned()))?;
        let own = store::workloads::list(w.settled().await?, job.id).await?;
        let tuned: Vec<tensortune_kernels::Workload> = own.iter().map(|r| r.workload.0).collect();
        let exclude: Vec<String> = own.into_iter().map(|r| r.workload_key).collect();
        let limit = PRIOR_RECORDS / slots.len().max(1) as u32;
        let mut parts = Vec::with_capacity(slots.len());
        let mut read = 0;
        let mut workloads = HashSet::new();
        for slot in &slots {
            let template = templates.get(*slot)?;
            let scope = PriorScope {
                device_class: &job.device_class,
                template: template.name(),
                template_version: template.version(),
                exclude: &exclude,
                before_ms: job.created_ms,
                limit,
            };
            let mut records = store::records::prior_records(w.conn(), &scope).await?;
            records.extend(self.pack_prior(w, job, template, &exclude, &records).await?);
            read += records.len();
            workloads.extend(records.iter().map(|r| r.workload_key.clone()));
            parts.push((template, records));
        }
        let started = std::time::Instant::now();
        let prior = Arc::new(search::prior(parts, layout, target.clone(), tuned).await?);
        tracing::info!(
            job = job.id,
            slots = ?slots,
            records = read,
            rows = prior.rows.len(),
            workloads = workloads.len(),
            ms = started.elapsed().as_millis() as u64,
            "transfer prior built"
        );
        w.insert_prior(key, Arc::clone(&prior));
        Ok(Some(prior))
    }

    /// Pack records (`crate::packs`) of `template` for a job's prior: those imported into the
    /// store and, unless `--no-prior-pack`, those this build ships (held in memory, parsed once
    /// per process): per workload that `own` (the store's records) does not hold, its records on
    /// the job's device class, or where that class has none, on the class of the same
    /// architecture with the most.
    async fn pack_prior(
        &self,
        w: &mut Write<'_>,
        job: &JobRow,
        template: &dyn tensortune_kernels::Template,
        exclude: &[String],
        own: &[PriorRecord],
    ) -> Result<Vec<PriorRecord>> {
        let Some(pattern) = crate::packs::arch_pattern(&job.device_class) else { return Ok(Vec::new()) };
        let mut exclude = exclude.to_vec();
        exclude.extend(own.iter().map(|r| r.workload_key.clone()));
        exclude.sort();
        exclude.dedup();
        let mut found = store::packs::prior(
            w.conn(),
            template.name(),
            template.version(),
            &pattern,
            &exclude,
            crate::packs::PRIOR_PACK_RECORDS,
        )
        .await?;
        if self.config.prior_pack {
            let shipped = tokio::task::spawn_blocking(crate::packs::shipped).await?;
            found.extend(crate::packs::shipped_prior(shipped, template, &job.device_class, &exclude));
        }
        // Per workload, the class to take: the job's own, else the one with the most records.
        let mut classes: HashMap<&str, HashMap<&str, usize>> = HashMap::new();
        for (class, r) in &found {
            *classes.entry(r.workload_key.as_str()).or_default().entry(class.as_str()).or_default() += 1;
        }
        let chosen: HashMap<String, String> = classes
            .into_iter()
            .map(|(workload, by_class)| {
                let class = if by_class.contains_key(job.device_class.as_str()) {
                    job.device_class.as_str()
                } else {
                    by_class.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))).map_or("", |(c, _)| *c)
                };
                (workload.to_owned(), class.to_owned())
            })
            .collect();
        Ok(found.into_iter().filter(|(class, r)| chosen.get(&r.workload_key) == Some(class)).map(|(_, r)| r).collect())
    }

    /// Proposes the first tasks of a job, or its next ones after a restart: per workload, or with
    /// a job-wide budget across them.
    pub(crate) async fn top_up_all(&self, w: &mut Write<'_>, job: &JobRow) -> Result<()> {
        if job.total_trials > 0 {
            return self.top_up_job(w, job).await;
        }
        for wl in store::workloads::list(w.settled().await?, job.id).await? {
            if wl.state == WorkloadState::Running {
                self.top_up(w, job, wl.idx).await?;
            }
        }
        Ok(())
    }

    /// Proposes what follows a finished trial of workload `idx`: its own top-up, or with a
    /// job-wide budget, the job's.
    pub(crate) async fn advance(&self, w: &mut Write<'_>, job: &JobRow, idx: u32) -> Result<()> {
        if job.total_trials > 0 { self.top_up_job(w, job).await } else { self.top_up(w, job, idx).await }
    }

    /// Proposes tasks for workload `idx` until `batch_size` are outstanding or its whole target has
    /// been proposed; for a tuner that proposes batches, the next whole batch once no more than
    /// [`lookahead`] are outstanding (so the worker compiles it while the last ones measure).
    pub(crate) async fn top_up(&self, w: &mut Write<'_>, job: &JobRow, idx: u32) -> Result<()> {
        if !job.is_active() {
            return Ok(());
        }
        loop {
            let wl = self.workload(w, job, idx).await?;
            if wl.state != WorkloadState::Running {
                return Ok(());
            }
            let left = wl.trials_target.saturating_sub(wl.proposed);
            if w.ready((job.id, idx)) {
                // A proposal made off the lock, asked for when there was room: its tasks now.
                let want = w.ahead((job.id, idx)).min(left);
                if want == 0 {
                    w.drop_ready((job.id, idx));
                    return Ok(());
                }
                match self.propose_tasks(w, job, &wl, want).await? {
                    Some(n) if n < want => continue,
                    _ => return Ok(()),
                }
            }
            if w.ahead((job.id, idx)) > 0 {
                // Being computed: it counts as the batch in flight.
                return Ok(());
            }
            let outstanding = match w.outstanding((job.id, idx)) {
                Some(n) => n,
                None => {
                    let n = store::tasks::outstanding(w.conn(), job.id, idx).await?;
                    w.counted_outstanding((job.id, idx), n);
                    n
                }
            };
            let batches = job.tuner.proposes_batches();
            if batches && outstanding > lookahead(job.batch_size) {
                return Ok(());
            }
            let room = if batches { job.batch_size } else { job.batch_size.saturating_sub(outstanding) };
            let want = room.min(left);
            if want == 0 {
                return Ok(());
            }
            // Every task asked for went to the queue: `batch_size` are outstanding (or the whole
            // target was proposed), which is where the next look would stop. Only proposals that
            // were answered from the store at once need another look; one made off the lock comes
            // back through `propose_ahead`.
            match self.propose_tasks(w, job, &wl, want).await? {
                Some(n) if n < want => {}
                _ => return Ok(()),
            }
        }
    }

    /// Proposes tasks across the workloads of a job with a budget (`total_trials`) until
    /// `batch_size` are outstanding in the job or the budget is spent: each next trial goes to the
    /// workload with the largest expected gain (`schedule::next`); for a tuner that proposes
    /// batches, each next batch, once no more than [`lookahead`] are outstanding in the job. Once
    /// the budget is spent,
    /// every running workload with nothing outstanding ends.
    async fn top_up_job(&self, w: &mut Write<'_>, job: &JobRow) -> Result<()> {
        if !job.is_active() {
            return Ok(());
        }
        // Each online worker of the job's class (one per GPU) keeps a batch of its own in flight,
        // each to another workload: with one worker, one batch at a time. Counted once a call.
        let workers = store::workers::online_in_class(w.conn(), &job.device_class).await?.max(1);
        loop {
            let rows = store::workloads::list(w.settled().await?, job.id).await?;
            let outstanding = store::tasks::outstanding_by_workload(w.conn(), job.id).await?;
            let outstanding_of = |idx: u32| outstanding.iter().find(|(i, _)| *i == idx).map_or(0, |(_, n)| *n);
            let used: u32 = rows.iter().map(|r| r.proposed).sum();
            let running: Vec<WorkloadRow> = rows.into_iter().filter(|r| r.state == WorkloadState::Running).collect();
            if let Some(wl) = running.iter().find(|r| w.ready((job.id, r.idx))) {
                // A proposal made off the lock, asked for when the budget and the workers had room
                // for it: its tasks now, before the next is asked for.
                let want = w
                    .ahead((job.id, wl.idx))
                    .min(job.total_trials.saturating_sub(used))
                    .min(wl.trials_target.saturating_sub(wl.proposed));
                if want == 0 {
                    w.drop_ready((job.id, wl.idx));
                } else {
                    self.propose_tasks(w, job, wl, want).await?;
                }
                continue;
            }
            // Proposals being computed off the lock hold their share of the budget and count as in
            // flight.
            let coming = |idx: u32| w.ahead((job.id, idx));
            let reserved: u32 = running.iter().map(|r| coming(r.idx)).sum();
            let left = job.total_trials.saturating_sub(used + reserved);
            if left == 0 {
                let mut ended = false;
                let idle: Vec<WorkloadRow> =
                    running.into_iter().filter(|r| outstanding_of(r.idx) == 0 && coming(r.idx) == 0).collect();
                for mut wl in idle {
                    self.end_tuning(w, job, &mut wl, WorkloadState::Done, "the job's trial budget is spent").await?;
                    store::workloads::save_progress(w.settled().await?, &wl).await?;
                    w.forget_workloads();
                    ended = true;
                }
                if ended {
                    self.touch_job(w, job.id).await?;
                    w.job_changed(job.id);
                    self.finish_job_if_done(w, job).await?;
                }
                return Ok(());
            }
            let in_flight: u32 = outstanding.iter().map(|(_, n)| n).sum::<u32>() + reserved;
            let batches = job.tuner.proposes_batches();
            let ahead = lookahead(job.batch_size);
            // A batch is proposed whole: freed slots wait for the end of one in flight rather
            // than go, one by one, to another workload as batches too small to explore.
            let want = match batches {
                true if in_flight > ahead + job.batch_size * (workers - 1) => 0,
                true => job.batch_size.min(left),
                false => (job.batch_size * workers).saturating_sub(in_flight).min(left),
            };
            if want == 0 || running.is_empty() {
                return Ok(());
            }
            let mut progress = Vec::with_capacity(running.len());
            for wl in &running {
                // A workload that proposed nothing observed nothing: its search (space, prior,
                // model) is built when its first batch is proposed, not all of the job's at its
                // start (ResNet-50's 27 took 17 s on an H200 host before the first task).
                if wl.proposed > 0 {
                    self.ensure_search(w, job, wl).await?;
                }
                let observed = w.observations((job.id, wl.idx));
                // A model's job (weights given) runs the vendor's kernel where it is faster: its
                // curves stop at every worker's latest vendor time (no worker's id is 0). Curves of
                // energy are not capped by a time.
                let vendor_us = match wl.weight {
                    Some(_) if job.objective() == Objective::Time => {
                        median(store::records::vendor_times(w.conn(), &wl.workload_key, &job.device_class, 0).await?)
                    }
                    _ => None,
                };
                progress.push(TaskProgress {
                    weight: wl.weight.unwrap_or(1.0),
                    best_after: best_after(&observed, wl.proposed),
                    // A workload whose batch is still out gets no second one before it is in
                    // (with one worker, never the case: nothing else is in flight then).
                    open: wl.proposed < wl.trials_target
                        && !(batches && outstanding_of(wl.idx) > ahead)
                        && w.ahead((job.id, wl.idx)) == 0,
                    vendor_us,
                });
            }
            let shares = allocate(progress, &running, want, batches);
            if shares.iter().all(|n| *n == 0) {
                // Every running workload has proposed its whole target or has a batch out; each
                // goes on (or ends) when its outstanding trials are in.
                return Ok(());
            }
            for (wl, n) in running.iter().zip(shares) {
                if n > 0 {
                    self.propose_tasks(w, job, wl, n).await?;
                }
            }
        }
    }

    /// Proposes up to `n` tasks of running workload `wl` (`n` at most what it may still propose). A
    /// config with an earlier deterministic record gets a task that is done at once, pointing at
    /// that record, so it counts as a trial without being measured again; proposing stops early
    /// when such a trial ends the workload.
    /// Returns how many of them are pending (not answered from the store), or `None` when the
    /// search proposes off the lock: the tasks come in a later write ([`Tracker::propose_ahead`]).
    async fn propose_tasks(&self, w: &mut Write<'_>, job: &JobRow, wl: &WorkloadRow, n: u32) -> Result<Option<u32>> {
        let idx = wl.idx;
        let templates = JobTemplates::of(job)?;
        let spaces: Vec<Space> = templates.all().iter().map(|t| t.space()).collect();
        self.ensure_search(w, job, wl).await?;
        let configs = match w.propose((job.id, idx), n as usize).await? {
            Proposal::Now(configs) => configs,
            Proposal::Later => return Ok(None),
        };
        if configs.is_empty() {
            return Err(Error::Internal(format!(
                "workload {idx} of job {} ran out of configs after {} of {}",
                job.id, wl.proposed, wl.trials_target
            )));
        }
        // Each config's earlier identical record is looked up at once per template (a proposal
        // holds one or a few) and the pending tasks are inserted together: a few statements per
        // proposal instead of two per config.
        let mut planned = Vec::with_capacity(configs.len());
        for point in configs {
            let template = templates.get(point.slot)?;
            let config = spaces[point.slot as usize]
                .config(point.index)
                .map_err(|e| Error::Internal(format!("config {} of {}: {e}", point.index, template.name())))?
                .to_json();
            planned.push((point, template, config));
        }
        let mut slots: Vec<u32> = planned.iter().map(|(point, ..)| point.slot).collect();
        slots.sort_unstable();
        slots.dedup();
        let mut reusable = HashMap::new();
        for slot in slots {
            let template = templates.get(slot)?;
            let scope = ContentScope {
                regime: &job.regime,
                workload_key: &wl.workload_key,
                template: template.name(),
                template_version: template.version(),
                device_class: &job.device_class,
            };
            let configs: Vec<(u64, &str)> = planned
                .iter()
                .filter(|(point, ..)| point.slot == slot)
                .map(|(point, _, config)| (point.index, config.as_str()))
                .collect();
            for (config, outcome) in store::records::reusable_among(w.conn(), &scope, &configs).await? {
                reusable.insert((slot, config), outcome);
            }
        }
        let now = w.now();
        let mut inserted = 0;
        let mut pending = 0;
        let mut waiting = Vec::new();
        for (point, template, config) in &planned {
            w.proposed((job.id, idx), *point);
            inserted += 1;
            let Some(outcome) = reusable.get(&(point.slot, config.clone())).copied() else {
                waiting.push(PendingTask {
                    template: template.name(),
                    template_version: template.version(),
                    config_index: point.index,
                    config,
                });
                pending += 1;
                continue;
            };
            // The pending tasks before it go in first: a trial that ends the workload cancels its
            // outstanding tasks.
            store::tasks::insert_pending(w.conn(), job.id, idx, &std::mem::take(&mut waiting), now).await?;
            let task = NewTask {
                job_id: job.id,
                workload_idx: idx,
                template: template.name(),
                template_version: template.version(),
                config_index: point.index,
                config,
                reuses: Some(outcome.id),
            };
            let task = store::tasks::insert(w.conn(), &task, now).await?;
            let trial = Trial { task, config: *point, outcome, reused: true, numbered: None };
            if self.finish_trial(w, job, idx, trial).await? != WorkloadState::Running {
                break;
            }
        }
        store::tasks::insert_pending(w.conn(), job.id, idx, &waiting, now).await?;
        store::workloads::add_proposed(w.conn(), job.id, idx, inserted).await?;
        w.proposed_more((job.id, idx), inserted);
        w.outstanding_changed((job.id, idx), pending, 0);
        if pending > 0 {
            w.tasks_ready(u64::from(pending));
        }
        w.job_changed(job.id);
        tracing::debug!(job = job.id, workload = idx, proposed = inserted, pending, "proposed tasks");
        Ok(Some(pending))
    }

    /// Computes a proposal made off the writer lock ([`Write::propose`]) on a blocking thread,
    /// then, in a write of its own, hands it to the search and advances the job (which turns it
    /// into tasks). Should that write fail, it tries again (the job is advanced again, which
    /// proposes anew if the proposal was lost with the write) until it goes through, the job
    /// ends or the tracker stops: a job must not wait for a proposal that never comes.
    pub(crate) async fn propose_ahead(self: Arc<Self>, key: search::SearchKey, work: search::AheadWork) {
        let generation = work.generation;
        let started = std::time::Instant::now();
        let mut points = match tokio::task::spawn_blocking(move || work.run()).await {
            Ok(points) => points,
            Err(e) => {
                // Handed over empty: the next write proposes in place and fails with the reason.
                tracing::error!(job = key.0, workload = key.1, "a proposal off the lock failed: {e}");
                Vec::new()
            }
        };
        tracing::debug!(
            job = key.0,
            workload = key.1,
            configs = points.len(),
            ms = started.elapsed().as_millis() as u64,
            "proposed off the lock"
        );
        let mut delivered = false;
        let mut pause = std::time::Duration::from_millis(100);
        loop {
            if self.shutdown.is_cancelled() {
                return;
            }
            let attempt = async {
                let mut w = self.write().await?;
                if !delivered {
                    delivered = true;
                    w.deliver(key, generation, std::mem::take(&mut points));
                }
                let Some(job) = store::jobs::get(w.conn(), key.0).await? else { return Ok(()) };
                self.advance(&mut w, &job, key.1).await?;
                w.commit(&self.events).await
            };
            match attempt.await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(job = key.0, workload = key.1, "advancing after a proposal: {e}; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(std::time::Duration::from_secs(5));
                }
            }
        }
    }

    /// Stores the record of a finished task and counts it; the caller then proposes what comes
    /// next ([`Tracker::advance`]), once for all the trials of a workload it finishes together.
    pub(crate) async fn record_result(
        &self,
        w: &mut Write<'_>,
        job: &JobRow,
        task: &TaskRow,
        producer: &Producer<'_>,
        measurement: &Measurement,
    ) -> Result<RecordId> {
        let stored = self.store_record(w, job, task, producer, measurement, &[]).await?;
        let mut stored = vec![(Arc::new(job.clone()), stored)];
        let (ids, _) = self.complete_stored(w, &mut stored).await?;
        ids.first()
            .copied()
            .ok_or_else(|| Error::Internal(format!("task {} was completed without its record", task.id)))
    }

    /// The first half of [`Tracker::record_result`]: the record of a finished tuning task, to
    /// insert, numbered as the workload's next trial after those of `earlier` (not counted yet).
    /// [`Tracker::complete_stored`] inserts it and marks its task done, for many at once.
    pub(crate) async fn store_record(
        &self,
        w: &mut Write<'_>,
        job: &JobRow,
        task: &TaskRow,
        producer: &Producer<'_>,
        measurement: &Measurement,
        earlier: &[(Arc<JobRow>, Stored)],
    ) -> Result<Stored> {
        let wl = self.workload(w, job, task.workload_idx).await?;
        let slot = JobTemplates::of(job)?.slot(&task.template, task.template_version).ok_or_else(|| {
            Error::Internal(format!(
                "task {} is of {} v{}, which job {} does not search",
                task.id, task.template, task.template_version, job.id
            ))
        })?;
        let record = ResultRecord {
            job_id: job.id,
            task_id: task.id,
            worker_id: producer.worker,
            workload: wl.workload.0,
            template: task.template.clone(),
            template_version: task.template_version,
            config: task.config.clone(),
            config_index: task.config_index,
            device_class: job.device_class.clone(),
            measurement: measurement.clone(),
            token_id: producer.token,
            untrusted: producer.untrusted(0).map(str::to_owned),
        };
        // Numbered at once: the trial it becomes is the workload's next (`finish_trial`).
        let earlier = earlier.iter().filter(|(j, s)| j.id == job.id && s.workload_idx == task.workload_idx).count();
        let number = wl.done.saturating_add(u32::try_from(earlier).unwrap_or(u32::MAX)).saturating_add(1);
        let outcome = Outcome {
            id: 0,
            status: measurement.status,
            median_us: measurement.median_us,
            trusted: producer.untrusted(0).is_none(),
            energy_mj: measurement.power.energy_mj,
        };
        let config = Point::new(slot, u64::try_from(task.config_index).unwrap_or_default());
        Ok(Stored {
            workload_idx: task.workload_idx,
            outstanding: task.kind == TaskKind::Tuning && matches!(task.state, TaskState::Pending | TaskState::Leased),
            record,
            trial: Trial { task: task.id, config, outcome, reused: false, numbered: Some(number) },
        })
    }

    /// Inserts the records of `stored` and marks their tasks done, a statement for each (but a
    /// record statement per 64 records), then counts each trial in order (the second half of
    /// [`Tracker::record_result`]); empties `stored`, which holds distinct tasks. Returns the
    /// records' ids in `stored`'s order, and whether a trial stopped a workload or a job, which
    /// cancels other tasks (rows of tasks read before are then out of date).
    pub(crate) async fn complete_stored(
        &self,
        w: &mut Write<'_>,
        stored: &mut Vec<(Arc<JobRow>, Stored)>,
    ) -> Result<(Vec<RecordId>, bool)> {
        if stored.is_empty() {
            return Ok((Vec::new(), false));
        }
        let stops = w.stops();
        let now = w.now();
        let records: Vec<NewRecord<'_>> = stored.iter().map(|(_, s)| s.record.as_new()).collect();
        let ids = store::records::insert_many(w.conn(), &records, now).await?;
        drop(records);
        let mut done = Vec::with_capacity(stored.len());
        for ((_, s), id) in stored.iter_mut().zip(&ids) {
            s.trial.outcome.id = *id;
            done.push(Completion { id: s.trial.task, record: *id, trial: s.trial.numbered });
        }
        store::tasks::complete_many(w.conn(), &done, now).await?;
        for (job, s) in std::mem::take(stored) {
            self.count_stored(w, &job, s).await?;
        }
        Ok((ids, w.stops() != stops))
    }

    /// Counts the trial of a stored record whose task is done.
    async fn count_stored(&self, w: &mut Write<'_>, job: &JobRow, stored: Stored) -> Result<()> {
        if stored.outstanding {
            w.outstanding_changed((job.id, stored.workload_idx), 0, 1);
        }
        self.finish_trial(w, job, stored.workload_idx, stored.trial).await?;
        Ok(())
    }

    /// Counts a finished task of workload `idx`: its place among the finished trials, its outcome
    /// for the search, progress, best record, early stopping, and the end of its tuning when it
    /// reached its target (then its finalists, or the end of the workload and perhaps of the job).
    /// Returns the workload's state.
    async fn finish_trial(&self, w: &mut Write<'_>, job: &JobRow, idx: u32, trial: Trial) -> Result<WorkloadState> {
        let Trial { task, config, outcome, reused, numbered } = trial;
        let mut wl = self.workload(w, job, idx).await?;
        wl.done += 1;
        wl.reused += u32::from(reused);
        if numbered != Some(wl.done) {
            store::tasks::set_trial(w.conn(), task, wl.done).await?;
        }
        // The job's objective: time, energy or energy x delay (the names below say time).
        let score = outcome.score(job.objective());
        w.observed((job.id, idx), Observed { config, time_us: score });
        if let Some(t) = score {
            // A winner chosen by re-measurement stands: a late trial (a cancelled task reported
            // after the workload ended) is counted but does not replace it.
            if wl.finalist_gap.is_none() && wl.best_us.is_none_or(|best| t < best) {
                wl.best_record_id = Some(outcome.id);
                wl.best_us = Some(t);
            }
            if wl.stall_best_us.is_none_or(|reference| t < reference * (1.0 - job.early_stop_margin)) {
                wl.stall_best_us = Some(t);
                wl.stall_since = wl.done;
            }
        }
        let mut ended = None;
        if wl.state == WorkloadState::Running {
            if wl.done >= wl.trials_target {
                // A target below the trials asked for means the valid space ran out first.
                ended =
                    Some(if wl.trials_target < job.trials { WorkloadState::Exhausted } else { WorkloadState::Done });
            } else if job.early_stop_trials > 0
                && wl.stall_best_us.is_some()
                && wl.done.saturating_sub(wl.stall_since) >= job.early_stop_trials
            {
                ended = Some(WorkloadState::EarlyStopped);
            }
        }
        if let Some(end) = ended {
            self.end_tuning(w, job, &mut wl, end, "").await?;
        }
        // Stored before the commit, once for all the trials of the workload the write finishes (its
        // best time beside its best record: the next read may take it as is).
        w.save_later(&wl);
        self.touch_job(w, job.id).await?;
        w.job_changed(job.id);
        if ended.is_some() {
            self.finish_job_if_done(w, job).await?;
        }
        Ok(wl.state)
    }

    /// Ends the tuning of running workload `wl` in `end`: its unfinished tasks are cancelled, its
    /// search goes, and it starts re-measuring its finalists (or takes `end`). The caller saves
    /// the row and then checks whether the job is done. `why` is for the log (empty: `end` says
    /// it).
    async fn end_tuning(
        &self,
        w: &mut Write<'_>,
        job: &JobRow,
        wl: &mut WorkloadRow,
        end: WorkloadState,
        why: &str,
    ) -> Result<()> {
        let now = w.now();
        let cancelled = store::tasks::cancel_unfinished(w.conn(), job.id, Some(wl.idx), now).await?;
        w.forget_outstanding((job.id, wl.idx));
        wl.chance_better = w.chance((job.id, wl.idx)).await?;
        w.stop_search(job.id, Some(wl.idx));
        wl.state = end;
        let finalizing = self.start_finalists(w, job, wl, end).await?;
        if !finalizing && job.max_slowdown > 0.0 {
            // No finalists: the least-energy tuning record within the slowdown of the fastest.
            let trials =
                store::records::fastest_trials(w.conn(), job.id, wl.idx, crate::finalists::CANDIDATE_TRIALS).await?;
            let figures: Vec<(f64, Option<f64>, usize)> =
                trials.iter().enumerate().map(|(i, t)| (t.median_us, t.energy_mj, i)).collect();
            if let Some(i) = energy::least_energy_within(&figures, job.max_slowdown) {
                wl.best_record_id = Some(trials[i].record_id);
                wl.best_us = job.objective().score(trials[i].median_us, trials[i].energy_mj);
            }
        }
        tracing::info!(
            job = job.id,
            workload = wl.idx,
            state = end.name(),
            why,
            finalizing,
            trials = wl.done,
            best_us = wl.best_us,
            cancelled,
            "workload tuning finished"
        );
        Ok(())
    }

    /// Marks the job done when none of its workloads is tuning or finalizing any more. Notes on
    /// the way (workloads that finished without finalists) stay in its error text.
    pub(crate) async fn finish_job_if_done(&self, w: &mut Write<'_>, job: &JobRow) -> Result<()> {
        let current = store::jobs::get(w.conn(), job.id).await?.ok_or(Error::JobNotFound(job.id))?;
        if current.state.is_terminal() || store::workloads::unfinished(w.settled().await?, job.id).await? > 0 {
            return Ok(());
        }
        let now = w.now();
        store::jobs::finish(w.conn(), job.id, JobState::Done, &current.error, now).await?;
        w.forget_job(job.id);
        w.stop_search(job.id, None);
        w.job_changed(job.id);
        tracing::info!(job = job.id, "job done");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(idx: u32, proposed: u32, target: u32) -> WorkloadRow {
        WorkloadRow {
            job_id: 1,
            idx,
            workload_key: String::new(),
            workload: store::Json(tensortune_kernels::template::drift_reference().0),
            trials_target: target,
            space_size: i64::from(target),
            proposed,
            done: 0,
            reused: 0,
            state: WorkloadState::Running,
            best_record_id: None,
            best_us: None,
            stall_best_us: None,
            stall_since: 0,
            end_state: None,
            finalist_gap: None,
            chance_better: None,
            weight: None,
        }
    }

    fn progress(rows: &[WorkloadRow], observed: &[&[Observed]]) -> Vec<TaskProgress> {
        rows.iter()
            .zip(observed)
            .map(|(r, o)| TaskProgress {
                weight: r.weight.unwrap_or(1.0),
                best_after: best_after(o, r.proposed),
                open: r.proposed < r.trials_target,
                vendor_us: None,
            })
            .collect()
    }

    #[test]
    fn trials_in_flight_hold_the_best_so_far() {
        let o = |index, time_us| Observed { config: Point::new(0, index), time_us };
        let observed = [o(1, None), o(2, Some(5.0)), o(3, Some(7.0)), o(4, Some(4.0))];
        assert_eq!(best_after(&observed, 6), [f64::INFINITY, 5.0, 5.0, 4.0, 4.0, 4.0]);
        assert_eq!(best_after(&[], 2), [f64::INFINITY; 2]);
    }

    #[test]
    fn warm_up_is_shared_by_what_was_proposed_then_batches_go_whole() {
        // Workload 0 has 6 proposed, 2 of them finished; workload 1 has none: the next 8 trials
        // even them out (7 each), counting workload 0's 4 in flight.
        let rows = [row(0, 6, 100), row(1, 0, 100)];
        let done = [
            Observed { config: Point::new(0, 1), time_us: Some(3.0) },
            Observed { config: Point::new(0, 2), time_us: Some(2.0) },
        ];
        let p = progress(&rows, &[&done, &[]]);
        assert_eq!(allocate(p.clone(), &rows, 8, false), [1, 7]);
        // A whole batch goes to the one workload picked (here the one with fewest trials).
        assert_eq!(allocate(p, &rows, 8, true), [0, 8]);
        // Nobody takes more than its target.
        let rows = [row(0, 0, 2), row(1, 0, 3)];
        let p = progress(&rows, &[&[], &[]]);
        assert_eq!(allocate(p.clone(), &rows, 10, false), [2, 3]);
        assert_eq!(allocate(p, &rows, 10, true), [2, 3]);
    }
}
