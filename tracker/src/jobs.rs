//! Jobs: submission (validation against the tracker's device classes), cancellation, and the read
//! side that the `Tuning` service serves (snapshots, listings, best records, exports).

use std::collections::HashMap;

use rand::RngExt;
use sqlx::SqliteConnection;
use tensortune_kernels::Workload;

use crate::error::{Error, Result};
use crate::finalists::{self, FinalistView};
use crate::model::{JobId, JobRequest, JobState, RecordFilter, RecordId, Status};
use crate::search::{self, Search, SpaceError};
use crate::store::jobs::{JobRow, NewJob};
use crate::store::records::Record;
use crate::store::workloads::{NewWorkload, WorkloadRow};
use crate::store::{self};
use crate::tracker::Tracker;

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

impl Tracker {
    /// Validates a job against the registered device classes, stores it and proposes its first
    /// tasks. Returns the job's id and the device class it was bound to.
    pub(crate) async fn submit(&self, req: JobRequest) -> Result<(JobId, String)> {
        // What needs no device first: a bad field is named even with no worker registered.
        for (i, workload) in req.workloads.iter().enumerate() {
            req.template.check_workload(workload).map_err(|e| workload_error(i, workload, e))?;
        }
        let class = self.resolve_device_class(req.device_class.as_deref()).await?;
        let target = store::classes::target(&self.pool, &class)
            .await?
            .ok_or_else(|| Error::Internal(format!("device class {class:?} vanished from the store")))?;
        for (i, workload) in req.workloads.iter().enumerate() {
            req.template.supports(workload, &target).map_err(|e| workload_error(i, workload, e))?;
        }
        let features = req.tuner.needs_features();
        let spaces = search::spaces(req.template, req.workloads.clone(), target.clone(), features).await?.map_err(
            |e| match e {
                SpaceError::Workload(i, e) => workload_error(i, &req.workloads[i], e),
                SpaceError::Internal(e) => e,
            },
        )?;
        for (i, space) in spaces.iter().enumerate() {
            if space.valid.is_empty() {
                return Err(Error::invalid(
                    format!("workloads[{i}]"),
                    format!(
                        "no config of {} v{} is valid for {} on device class {class:?}; try another template",
                        req.template.name(),
                        req.template.version(),
                        req.workloads[i].key()
                    ),
                ));
            }
        }
        // 0 is "pick one" on the wire, so a picked seed is never 0.
        let seed = req.seed.unwrap_or_else(|| rand::rng().random::<u64>().max(1));
        let early = req.early_stop.unwrap_or(crate::model::EarlyStop { trials: 0, margin: 0.0 });
        let new = NewJob {
            template: req.template.name(),
            template_version: req.template.version(),
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
        };

        let mut w = self.write().await?;
        let now = w.now();
        let id = store::jobs::insert(w.conn(), &new, now).await?;
        for (i, (workload, space)) in req.workloads.iter().zip(&spaces).enumerate() {
            let idx = i as u32;
            let space_size = space.valid.len() as u64;
            let trials_target = u32::try_from(space_size).unwrap_or(u32::MAX).min(req.trials);
            let row = NewWorkload { idx, workload, trials_target, space_size };
            store::workloads::insert(w.conn(), id, &row).await?;
        }
        let job = store::jobs::get(w.conn(), id).await?.ok_or(Error::JobNotFound(id))?;
        let prior = self.job_prior(&mut w, &job, req.template, &target).await?;
        for (i, space) in spaces.iter().enumerate() {
            let idx = i as u32;
            let tuner = req.tuner.build(space, seed, idx, prior.clone())?;
            w.insert_search((id, idx), Search::new(tuner, [], Vec::new()));
        }
        self.top_up_all(&mut w, &job).await?;
        w.job_changed(id);
        w.commit(&self.events).await?;
        tracing::info!(
            job = id,
            device_class = %class,
            template = req.template.name(),
            tuner = %req.tuner,
            workloads = req.workloads.len(),
            trials = req.trials,
            seed,
            finalists = req.finalists,
            flush_l2 = req.flush_l2,
            transfer = req.transfer,
            prior_rows = prior.as_ref().map(|p| p.rows.len()),
            total_trials = req.total_trials,
            "job submitted"
        );
        Ok((id, class))
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
    pub(crate) async fn cancel(&self, id: JobId) -> Result<JobView> {
        let mut w = self.write().await?;
        let job = store::jobs::get(w.conn(), id).await?.ok_or(Error::JobNotFound(id))?;
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

    /// A snapshot of job `id`.
    pub(crate) async fn job(&self, id: JobId) -> Result<JobView> {
        // One read transaction: the job, its workloads and their records from the same instant.
        let mut tx = self.pool.begin().await?;
        let job = store::jobs::get(&mut *tx, id).await?.ok_or(Error::JobNotFound(id))?;
        view(&mut tx, job).await
    }

    /// Jobs in `states` (all when empty), newest first.
    pub(crate) async fn jobs(&self, states: &[JobState], limit: u32) -> Result<Vec<JobView>> {
        let mut tx = self.pool.begin().await?;
        let rows = store::jobs::list(&mut *tx, states, limit).await?;
        let mut out = Vec::with_capacity(rows.len());
        for job in rows {
            out.push(view(&mut tx, job).await?);
        }
        Ok(out)
    }

    /// The fastest ok record of `workload` per device class among the records of `templates`
    /// (name, version), fastest first.
    pub(crate) async fn best(
        &self,
        workload: &Workload,
        templates: &[(&str, u32)],
        device_class: Option<&str>,
    ) -> Result<Vec<Record>> {
        let spelled: Vec<String> = templates.iter().map(|(name, version)| format!("{name}@{version}")).collect();
        store::records::best(&self.pool, &workload.key(), &spelled, device_class).await
    }

    /// Up to `limit` records matching `filter` after record `after`, oldest first.
    pub(crate) async fn records(&self, filter: &RecordFilter, after: RecordId, limit: u32) -> Result<Vec<Record>> {
        store::records::page(&self.pool, filter, after, limit).await
    }
}

/// The snapshot of `job` read through `conn`.
async fn view(conn: &mut SqliteConnection, job: JobRow) -> Result<JobView> {
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

/// A template's objection to workload `i`, naming the field (`workloads[0].matmul.k`).
fn workload_error(i: usize, workload: &Workload, e: tensortune_kernels::Error) -> Error {
    match e {
        tensortune_kernels::Error::Invalid { field, message } => {
            Error::invalid(format!("workloads[{i}].{}.{field}", workload.op().name()), message)
        }
        other => Error::invalid(format!("workloads[{i}]"), other.to_string()),
    }
}
