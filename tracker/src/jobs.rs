//! Jobs: submission (validation against the tracker's device classes), cancellation, and the read
//! side that the `Tuning` service serves (snapshots, listings, best records, exports).

use std::collections::{BTreeSet, HashMap};

use rand::RngExt;
use tensortune_kernels::energy::{Objective, Regime};
use tensortune_kernels::registry;
use tensortune_kernels::{Template, Workload};

use crate::auth::Caller;
use crate::error::{Error, Result};
use crate::finalists::{self, FinalistView};
use crate::model::{JobId, JobRequest, JobState, RecordFilter, RecordId, Status};
use crate::progress::JobTemplates;
use crate::search::{self, Rejection, Rejections, Search};
use crate::store::jobs::{JobRow, NewJob};
use crate::store::records::Record;
use crate::store::workloads::{NewWorkload, WorkloadRow};
use crate::store::{self, Tx};
use crate::tracker::Tracker;
use crate::tuner::{Point, WorkloadSpace};

/// Most workloads one job may hold.
pub(crate) const MAX_WORKLOADS: usize = 1024;

/// A job with the progress of each workload, as one consistent snapshot.
#[derive(Clone, Debug)]
pub(crate) struct JobView {
    pub(crate) job: JobRow,
    pub(crate) workloads: Vec<WorkloadView>,
}

/// One workload's progress.
#[derive(Clone, Debug)]
pub(crate) struct WorkloadView {
    pub(crate) row: WorkloadRow,
    pub(crate) best: Option<Record>,
    /// Finished tuning tasks per record status.
    pub(crate) status_counts: Vec<(Status, u32)>,
    /// Its finalists, fastest re-measurement first, once re-measured.
    pub(crate) finalists: Vec<FinalistView>,
}

/// What of a job needs no device and no store: a bad field is named first, even with no worker
/// registered and before any limit applies.
pub(crate) fn check_job(req: &JobRequest) -> Result<()> {
    // A cold-L2 timing is single launches between flushes: it reads no energy and never waits for
    // a steady clock, so what needs either would be chosen on unknowns.
    if req.flush_l2 {
        let needs = [
            (req.objective != Objective::Time, format!("objective {}", req.objective)),
            (req.regime != Regime::Burst, format!("regime {}", req.regime)),
            (req.max_slowdown > 0.0, format!("max_slowdown {}", req.max_slowdown)),
        ];
        if let Some((_, what)) = needs.iter().find(|n| n.0) {
            return Err(Error::invalid(
                "flush_l2",
                format!(
                    "cold-L2 timing reads no energy and no steady clock, so it cannot serve {what}; allowed with \
                     flush_l2: objective time, regime burst, max_slowdown 0"
                ),
            ));
        }
    }
    for (i, workload) in req.workloads.iter().enumerate() {
        check_workload(req.template, i, workload)?;
    }
    Ok(())
}

impl Tracker {
    /// The first batches of model job `id`, stored (with its searches) by a write that proposed
    /// none: each tuner's costly first step (the transfer prior's model, `Tuner::prepare`) runs
    /// on a blocking thread outside the writer lock, which other jobs' reports and leases take
    /// meanwhile, then a second write proposes. The batches are those one write would have
    /// proposed. Should that write fail, the job fails with the reason rather than wait for a
    /// restart without tasks.
    async fn first_batches(&self, id: JobId, tuners: Vec<std::sync::Arc<dyn crate::tuner::Tuner>>) -> Result<()> {
        let started = std::time::Instant::now();
        tokio::task::spawn_blocking(move || tuners.iter().for_each(|t| t.prepare())).await?;
        tracing::debug!(job = id, ms = started.elapsed().as_millis() as u64, "tuners prepared outside the lock");
        let proposed = async {
            let mut w = self.write().await?;
            // Re-read: the job may have been cancelled meanwhile (then nothing is proposed).
            let job = store::jobs::get(w.conn(), id).await?.ok_or(Error::JobNotFound(id))?;
            self.top_up_all(&mut w, &job).await?;
            w.commit(&self.events).await
        };
        let Err(e) = proposed.await else { return Ok(()) };
        tracing::warn!(job = id, error = %e, "the first batch of a job could not be proposed; the job fails");
        let mut w = self.write().await?;
        let why = format!("its first batch could not be proposed: {e}");
        let now = w.now();
        store::jobs::finish(w.conn(), id, JobState::Failed, &why, now).await?;
        w.stop_search(id, None);
        w.job_changed(id);
        w.commit(&self.events).await?;
        Err(e)
    }

    /// Validates a job against the registered device classes, stores it and proposes its first
    /// tasks. Returns the job's id and the device class it was bound to.
    ///
    /// A job that names a template searches it alone. One that names none searches, per workload,
    /// every template that takes the workload on the device class (of those that some worker of
    /// the class runs, when any does): a template that rejects a workload contributes nothing to
    /// it, and a workload no template takes is refused with each one's reason.
    pub(crate) async fn submit(&self, req: JobRequest, caller: &Caller) -> Result<(JobId, String)> {
        check_job(&req)?;
        let class = self.resolve_device_class(req.device_class.as_deref()).await?;
        let target = store::classes::target(&self.pool, &class)
            .await?
            .ok_or_else(|| Error::Internal(format!("device class {class:?} vanished from the store")))?;
        let candidates = match req.template {
            Some(template) => vec![template],
            None => self.union_candidates(&class, &req.workloads).await?,
        };
        let features = req.tuner.needs_features();
        let spaces = search::spaces(candidates.clone(), req.workloads.clone(), target.clone(), features).await?;
        let mut valid = Vec::with_capacity(spaces.len());
        for (i, space) in spaces.into_iter().enumerate() {
            match space {
                Ok(space) => valid.push(space),
                Err(rejections) => return Err(refusal(i, &req.workloads[i], &class, &candidates, rejections)),
            }
        }
        // The job lists the templates that contribute to some workload, in registry order; the
        // slots of the spaces follow.
        let used: BTreeSet<u32> = valid.iter().flat_map(search::slots_of).collect();
        let remap: HashMap<u32, u32> = used.iter().enumerate().map(|(new, old)| (*old, new as u32)).collect();
        let listed: Vec<&'static dyn Template> = used.iter().map(|s| candidates[*s as usize]).collect();
        let spaces: Vec<WorkloadSpace> = valid
            .into_iter()
            .map(|s| WorkloadSpace {
                valid: s.valid.iter().map(|p| Point::new(remap[&p.slot], p.index)).collect(),
                ..s
            })
            .collect();
        let display: Vec<&str> = listed.iter().map(|t| t.name()).collect();
        let display = display.join("+");
        let spelled: Vec<String> = listed.iter().map(|t| format!("{}@{}", t.name(), t.version())).collect();
        let version = match listed.as_slice() {
            [only] => only.version(),
            _ => 0,
        };
        // 0 is "pick one" on the wire, so a picked seed is never 0.
        let seed = req.seed.unwrap_or_else(|| rand::rng().random::<u64>().max(1));
        let early = req.early_stop.unwrap_or(crate::model::EarlyStop { trials: 0, margin: 0.0 });
        let new = NewJob {
            template: &display,
            template_version: version,
            templates: &spelled,
            tuner: req.tuner,
            device_class: &class,
            trials: req.trials,
            batch_size: req.batch_size,
            seed,
            samples: req.samples,
            label: &req.label,
            early_stop_trials: early.trials,
            early_stop_margin: early.margin,
            finalists: req.finalists,
            finalist_rounds: req.finalist_rounds,
            flush_l2: req.flush_l2,
            transfer: req.transfer,
            total_trials: req.total_trials,
            regime: req.regime,
            objective: req.objective,
            max_slowdown: req.max_slowdown,
            no_energy: req.no_energy,
            token_id: caller.token,
        };

        let mut w = self.write().await?;
        let now = w.now();
        let id = store::jobs::insert(w.conn(), &new, now).await?;
        for (i, (workload, space)) in req.workloads.iter().zip(&spaces).enumerate() {
            let idx = i as u32;
            let space_size = space.valid.len() as u64;
            let trials_target = u32::try_from(space_size).unwrap_or(u32::MAX).min(req.trials);
            let weight = req.weights.as_ref().and_then(|w| w.get(i).copied());
            let row = NewWorkload { idx, workload, trials_target, space_size, weight };
            store::workloads::insert(w.conn(), id, &row).await?;
        }
        let job = store::jobs::get(w.conn(), id).await?.ok_or(Error::JobNotFound(id))?;
        let templates = JobTemplates::of(&job)?;
        let mut prior_rows = 0;
        let mut tuners = Vec::with_capacity(spaces.len());
        for (i, space) in spaces.iter().enumerate() {
            let idx = i as u32;
            let prior = self.job_prior(&mut w, &job, &templates, space, &target).await?;
            prior_rows = prior_rows.max(prior.as_ref().map_or(0, |p| p.rows.len()));
            let tuner = req.tuner.build(space, seed, idx, prior)?;
            tuners.push(std::sync::Arc::clone(&tuner));
            w.insert_search((id, idx), Search::new(tuner, [], Vec::new()));
        }
        let prepare = req.tuner.proposes_batches();
        if !prepare {
            self.top_up_all(&mut w, &job).await?;
        }
        w.job_changed(id);
        w.commit(&self.events).await?;
        if prepare {
            self.first_batches(id, tuners).await?;
        }
        tracing::info!(
            job = id,
            device_class = %class,
            templates = %spelled.join(","),
            tuner = %req.tuner,
            workloads = req.workloads.len(),
            trials = req.trials,
            seed,
            finalists = req.finalists,
            flush_l2 = req.flush_l2,
            transfer = req.transfer,
            prior_rows,
            total_trials = req.total_trials,
            "job submitted"
        );
        Ok((id, class))
    }

    /// The templates a job that names none may search on `class`: per op of `workloads`, those
    /// that some registered worker of the class runs (name and version), or every one of the op
    /// when no worker runs any (its tasks then wait for one, as a named template's would). Only
    /// templates that take one of the job's workloads of that op at all (`check_workload`) join,
    /// so an f16 job searches wmma_gemm+wgmma_gemm and an f32 one simt_gemm, whatever else the
    /// registry holds.
    async fn union_candidates(&self, class: &str, workloads: &[Workload]) -> Result<Vec<&'static dyn Template>> {
        let run = store::workers::class_templates(&self.pool, class).await?;
        let runs = |t: &&'static dyn Template| run.contains(&format!("{}@{}", t.name(), t.version()));
        let mut out: Vec<&'static dyn Template> = Vec::new();
        for op in workloads.iter().map(Workload::op) {
            if out.iter().any(|t| t.op() == op) {
                continue;
            }
            let takes_one = |t: &&'static dyn Template| {
                workloads.iter().filter(|w| w.op() == op).any(|w| t.check_workload(w).is_ok())
            };
            let all: Vec<_> = registry::templates_for(op).into_iter().filter(takes_one).collect();
            let ran: Vec<_> = all.iter().copied().filter(runs).collect();
            out.extend(if ran.is_empty() { all } else { ran });
        }
        // Registry order, whatever the order of the workloads' ops.
        let registry = registry::all();
        out.sort_by_key(|t| registry.iter().position(|r| r.name() == t.name()));
        Ok(out)
    }

    /// The class a job is bound to: the one requested, which some worker must have registered, or
    /// the only registered one.
    async fn resolve_device_class(&self, requested: Option<&str>) -> Result<String> {
        let known = store::classes::keys(&self.pool).await?;
        match (requested, known.as_slice()) {
            (Some(class), known) if known.iter().any(|k| k == class) => Ok(class.to_owned()),
            (Some(class), []) => Err(Error::Precondition(format!(
                "no worker of device class {class:?} has registered (no worker has registered yet); start one first"
            ))),
            (Some(class), known) => Err(Error::Precondition(format!(
                "no worker of device class {class:?} has registered; known classes: {}",
                known.join(", ")
            ))),
            (None, []) => Err(Error::Precondition(
                "no worker has registered yet; start a worker or pass --device-class".to_owned(),
            )),
            (None, [only]) => Ok(only.clone()),
            (None, several) => Err(Error::Precondition(format!(
                "workers of several device classes have registered ({}); pass --device-class to pick one",
                several.join(", ")
            ))),
        }
    }

    /// Cancels a queued or running job: its unfinished tasks are cancelled (holders learn it from
    /// their heartbeats; their reports are still stored). Cancelling a cancelled job is a no-op.
    pub(crate) async fn cancel(&self, id: JobId, caller: &Caller) -> Result<JobView> {
        let mut w = self.write().await?;
        let job = store::jobs::get(w.conn(), id).await?.ok_or(Error::JobNotFound(id))?;
        if !caller.owns(job.token_id) {
            return Err(Error::Denied(format!(
                "job {id} was submitted with another token; a client token cancels only its own jobs (an admin token \
                 cancels any)"
            )));
        }
        match job.state {
            JobState::Cancelled => {}
            JobState::Done | JobState::Failed => {
                return Err(Error::Precondition(format!(
                    "job {id} already ended ({}); only queued or running jobs can be cancelled",
                    job.state.name()
                )));
            }
            JobState::Queued | JobState::Running => {
                let now = w.now();
                let cancelled = store::tasks::cancel_unfinished(w.conn(), id, None, now).await?;
                store::jobs::finish(w.conn(), id, JobState::Cancelled, "cancelled by request", now).await?;
                w.stop_search(id, None);
                w.job_changed(id);
                tracing::info!(job = id, tasks = cancelled, "job cancelled");
            }
        }
        w.commit(&self.events).await?;
        self.job(id).await
    }

    /// Fails with `JobNotFound` unless job `id` exists.
    pub(crate) async fn require_job(&self, id: JobId) -> Result<()> {
        store::jobs::get(&self.pool, id).await?.map(drop).ok_or(Error::JobNotFound(id))
    }

    /// A snapshot of job `id`.
    pub(crate) async fn job(&self, id: JobId) -> Result<JobView> {
        // One read transaction: the job, its workloads and their records from the same instant.
        let mut tx = self.pool.begin().await?;
        let job = store::jobs::get(&mut tx, id).await?.ok_or(Error::JobNotFound(id))?;
        view(&mut tx, job).await
    }

    /// Jobs in `states` (all when empty), newest first.
    pub(crate) async fn jobs(&self, states: &[JobState], limit: u32) -> Result<Vec<JobView>> {
        let mut tx = self.pool.begin().await?;
        let rows = store::jobs::list(&mut tx, states, limit).await?;
        let mut out = Vec::with_capacity(rows.len());
        for job in rows {
            out.push(view(&mut tx, job).await?);
        }
        Ok(out)
    }

    /// The best ok record of `workload` per device class (`store::records::best`: a re-measured
    /// time job's verdict stands for its other records) among the records of `templates`
    /// (name, version) timed in `regime`, fastest first. With `nearest`, a class that has no record of `workload`
    /// answers with its best record of the nearest tuned shape ([`Workload::shape_distance`]),
    /// whose workload key tells it apart.
    pub(crate) async fn best(
        &self,
        workload: &Workload,
        templates: &[(&str, u32)],
        device_class: Option<&str>,
        regime: Regime,
        nearest: bool,
    ) -> Result<Vec<Record>> {
        let spelled: Vec<String> = templates.iter().map(|(name, version)| format!("{name}@{version}")).collect();
        let mut best = store::records::best(&self.pool, &workload.key(), &spelled, device_class, regime).await?;
        if !nearest {
            return Ok(best);
        }
        // Classes without a record of this shape get the best record of the nearest tuned shape.
        let answered: BTreeSet<String> = best.iter().map(|r| r.device_class.clone()).collect();
        let candidates = store::records::best_per_workload(
            &self.pool,
            &workload.comparable_key_pattern(),
            &spelled,
            device_class,
            regime,
        )
        .await?;
        let mut nearest: HashMap<String, (f64, Record)> = HashMap::new();
        for r in candidates {
            if answered.contains(&r.device_class) {
                continue;
            }
            let Some(d) = workload.shape_distance(&r.workload.0) else { continue };
            // Ties go to the faster record (candidates come in key order, so the answer is stable).
            let better =
                nearest.get(&r.device_class).is_none_or(|(bd, br)| d < *bd || (d == *bd && r.median_us < br.median_us));
            if better {
                nearest.insert(r.device_class.clone(), (d, r));
            }
        }
        best.extend(nearest.into_values().map(|(_, r)| r));
        best.sort_by(|a, b| a.median_us.total_cmp(&b.median_us).then(a.id.cmp(&b.id)));
        Ok(best)
    }

    /// The limits of device class `key` as its workers registered them (what its kernels are
    /// generated for).
    pub(crate) async fn class_target(&self, key: &str) -> Result<Option<tensortune_kernels::Target>> {
        store::classes::target(&self.pool, key).await
    }

    /// Up to `limit` records matching `filter` after record `after`, oldest first.
    pub(crate) async fn records(&self, filter: &RecordFilter, after: RecordId, limit: u32) -> Result<Vec<Record>> {
        store::records::page(&self.pool, filter, after, limit).await
    }
}

/// The snapshot of `job` read through `conn`.
async fn view(conn: &mut Tx, job: JobRow) -> Result<JobView> {
    let rows = store::workloads::list(&mut *conn, job.id).await?;
    let best_ids: Vec<RecordId> = rows.iter().filter_map(|w| w.best_record_id).collect();
    let mut best: HashMap<RecordId, Record> =
        store::records::get_many(&mut *conn, &best_ids).await?.into_iter().map(|r| (r.id, r)).collect();
    let counts = store::workloads::status_counts(&mut *conn, job.id).await?;
    let decided: Vec<u32> = rows.iter().filter(|w| w.finalist_gap.is_some()).map(|w| w.idx).collect();
    let mut finalists: HashMap<u32, Vec<FinalistView>> = if decided.is_empty() {
        HashMap::new()
    } else {
        let tasks = store::tasks::finalist_tasks(&mut *conn, job.id).await?;
        let remeasured = store::records::remeasured(&mut *conn, job.id).await?;
        finalists::views(&tasks, &remeasured, &decided).into_iter().collect()
    };
    let workloads = rows
        .into_iter()
        .map(|row| WorkloadView {
            best: row.best_record_id.and_then(|id| best.remove(&id)),
            status_counts: counts.iter().filter(|(i, ..)| *i == row.idx).map(|(_, s, n)| (*s, *n)).collect(),
            finalists: finalists.remove(&row.idx).unwrap_or_default(),
            row,
        })
        .collect();
    Ok(JobView { job, workloads })
}

/// Checks what needs no device of workload `i`: against `template`, or when none is named, that
/// some template of its op takes it (each one's reason otherwise).
fn check_workload(template: Option<&'static dyn Template>, i: usize, workload: &Workload) -> Result<()> {
    if let Some(t) = template {
        return t.check_workload(workload).map_err(|e| workload_error(i, workload, e));
    }
    let all = registry::templates_for(workload.op());
    if all.is_empty() {
        return Err(Error::invalid(
            format!("workloads[{i}]"),
            format!("no template implements {} yet", workload.op().name()),
        ));
    }
    let mut rejections = Vec::new();
    for t in &all {
        match t.check_workload(workload) {
            Ok(()) => return Ok(()),
            Err(e) => rejections.push((t.name(), Rejection::Unsupported(e))),
        }
    }
    Err(refusal(i, workload, "", &all, rejections))
}

/// Why workload `i` is refused: no template of `candidates` takes it (each one's objection in
/// `rejections`). With one template, its objection as such, naming the field; with several, the
/// field they all name (or the workload when they differ) and each one's reason.
fn refusal(
    i: usize,
    workload: &Workload,
    class: &str,
    candidates: &[&'static dyn Template],
    rejections: Rejections,
) -> Error {
    // A template built for other types (simt_gemm for f32, mma_ext_gemm for tf32 and the packed
    // types) has nothing to say about an f16 workload's K: where some template takes the input
    // type, only those templates' reasons are given.
    let other_type =
        |r: &Rejection| matches!(r, Rejection::Unsupported(tensortune_kernels::Error::Invalid { field: "input", .. }));
    let rejections: Rejections = if rejections.iter().all(|(_, r)| other_type(r)) {
        rejections
    } else {
        rejections.into_iter().filter(|(_, r)| !other_type(r)).collect()
    };
    let fields: BTreeSet<Option<String>> = rejections
        .iter()
        .map(|(_, r)| match r {
            Rejection::Unsupported(tensortune_kernels::Error::Invalid { field, .. }) => Some(field.to_string()),
            _ => None,
        })
        .collect();
    if rejections.len() == 1 {
        let (name, rejection) = rejections.into_iter().next().expect("one rejection");
        return match rejection {
            Rejection::Unsupported(e) => workload_error(i, workload, e),
            Rejection::NoValidConfig => {
                let version = candidates.iter().find(|t| t.name() == name).map_or(0, |t| t.version());
                Error::invalid(
                    format!("workloads[{i}]"),
                    format!(
                        "no config of {name} v{version} is valid for {} on device class {class:?}; try another template",
                        workload.key()
                    ),
                )
            }
        };
    }
    let field = match fields.iter().next() {
        Some(Some(field)) if fields.len() == 1 => format!("workloads[{i}].{}.{field}", workload.op().name()),
        _ => format!("workloads[{i}]"),
    };
    let reasons: Vec<String> = rejections
        .iter()
        .map(|(name, r)| match r {
            Rejection::Unsupported(tensortune_kernels::Error::Invalid { field, message }) if fields.len() > 1 => {
                format!("{name} ({field}): {message}")
            }
            Rejection::Unsupported(tensortune_kernels::Error::Invalid { message, .. }) => format!("{name}: {message}"),
            other => format!("{name}: {other}"),
        })
        .collect();
    Error::invalid(field, format!("no template takes this workload; {}", reasons.join("; ")))
}

/// A template's objection to workload `i`, naming the field (`workloads[0].matmul.k`).
fn workload_error(i: usize, workload: &Workload, e: tensortune_kernels::Error) -> Error {
    match e {
        tensortune_kernels::Error::Invalid { field, message } => {
            Error::invalid(format!("workloads[{i}].{}.{field}", workload.op().name()), message)
        }
        other => Error::invalid(format!("workloads[{i}]"), other.to_string()),
    }
}
