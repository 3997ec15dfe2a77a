//! Dispatch to workers: registration, leasing with long polls, heartbeats and reports.

use std::collections::HashSet;
use std::time::Duration;

use tokio::time::Instant;

use crate::drift::{self, Drift};
use crate::error::{Error, Result};
use crate::model::{JobId, RecordId, Registration, Reported, TaskId, TaskKind, TaskState, WorkerId};
use crate::store::tasks::{LeasedTask, TaskRow};
use crate::store::workers::WorkerRow;
use crate::store::{self};
use crate::tracker::Tracker;

/// What became of a report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Report {
    /// False when the task already had a record: the report was acknowledged and dropped.
    pub(crate) stored: bool,
    /// The task's record (the earlier one when not stored).
    pub(crate) record_id: Option<RecordId>,
}

impl Tracker {
    /// Registers a worker (or re-registers one that passes its previous id, keeping its leases)
    /// and records its device class.
    pub(crate) async fn register(&self, reg: &Registration) -> Result<WorkerId> {
        let mut w = self.write().await?;
        let now = w.now();
        store::classes::upsert(w.conn(), &reg.device.target, now).await?;
        let id = match reg.previous_id {
            Some(previous) if store::workers::reregister(w.conn(), previous, reg, now).await? => previous,
            _ => store::workers::insert(w.conn(), reg, now).await?,
        };
        w.commit(&self.events).await?;
        let templates: Vec<String> = reg.templates.iter().map(|t| t.spelled()).collect();
        tracing::info!(
            worker = id,
            name = %reg.name,
            device_class = %reg.device.target.class_key,
            templates = %templates.join(","),
            resumed = reg.previous_id == Some(id),
            "worker registered"
        );
        Ok(id)
    }

    /// Leases up to `max` tasks to `worker`, waiting up to `wait` for some to become pending.
    pub(crate) async fn lease(&self, worker: WorkerId, max: u32, wait: Duration) -> Result<Vec<LeasedTask>> {
        let deadline = Instant::now() + wait;
        loop {
            // Registered before looking, so that tasks proposed between the look and the wait
            // still wake this call.
            let ready = self.events.next_tasks();
            tokio::pin!(ready);
            ready.as_mut().enable();
            let tasks = self.try_lease(worker, max).await?;
            if !tasks.is_empty() || Instant::now() >= deadline {
                return Ok(tasks);
            }
            tokio::select! {
                () = ready => {}
                () = tokio::time::sleep_until(deadline) => return Ok(Vec::new()),
                () = self.shutdown.cancelled() => return Ok(Vec::new()),
            }
        }
    }

    async fn try_lease(&self, worker: WorkerId, max: u32) -> Result<Vec<LeasedTask>> {
        let mut w = self.write().await?;
        let now = w.now();
        let row = store::workers::get(w.conn(), worker).await?.ok_or(Error::WorkerNotFound(worker))?;
        store::workers::touch(w.conn(), worker, now).await?;
        let expires = self.lease_deadline(now);
        let ids = store::tasks::lease(w.conn(), worker, &row.device_class, &row.templates.0, max, expires, now).await?;
        if ids.is_empty() {
            w.commit(&self.events).await?;
            return Ok(Vec::new());
        }
        let tasks = store::tasks::leased_details(w.conn(), &ids).await?;
        let mut jobs: Vec<JobId> = tasks.iter().map(|t| t.job_id).collect();
        jobs.dedup();
        for job in store::jobs::mark_running(w.conn(), &jobs, now).await? {
            w.job_changed(job);
            tracing::info!(job, "job running");
        }
        w.commit(&self.events).await?;
        tracing::debug!(worker, tasks = tasks.len(), "leased tasks");
        Ok(tasks)
    }

    /// Renews the leases `worker` holds among `tasks` and stores its latest reference time (when it
    /// has one); returns the tasks it should drop (leased to another worker, done, cancelled or
    /// unknown), in the order given.
    pub(crate) async fn heartbeat(
        &self,
        worker: WorkerId,
        tasks: &[TaskId],
        reference_us: Option<f64>,
    ) -> Result<Vec<TaskId>> {
        let mut w = self.write().await?;
        let now = w.now();
        if !store::workers::touch(w.conn(), worker, now).await? {
            return Err(Error::WorkerNotFound(worker));
        }
        let flag = match reference_us {
            Some(r) => drift::note_reference(&mut w, worker, r).await?,
            None => None,
        };
        let renewed: HashSet<TaskId> = if tasks.is_empty() {
            HashSet::new()
        } else {
            let expires = self.lease_deadline(now);
            store::tasks::renew(w.conn(), worker, tasks, expires).await?.into_iter().collect()
        };
        w.commit(&self.events).await?;
        if let Some(change) = flag {
            change.log();
        }
        let mut seen = HashSet::new();
        let drop: Vec<TaskId> = tasks.iter().copied().filter(|t| !renewed.contains(t) && seen.insert(*t)).collect();
        if !drop.is_empty() {
            tracing::debug!(worker, drop = ?drop, "heartbeat: tasks to drop");
        }
        Ok(drop)
    }

    /// Stores what a worker measured for a task: a tuning task's measurement, or a finalist task's
    /// re-measurements. A task that already has its records acknowledges and drops the report.
    /// Accepted from the worker holding the lease, or from the last holder of a task whose lease
    /// expired (and nobody else took it) or whose job was cancelled, so that a late report loses
    /// nothing.
    pub(crate) async fn report(
        &self,
        worker: WorkerId,
        task_id: TaskId,
        lease_serial: u32,
        reported: &Reported,
    ) -> Result<Report> {
        let mut w = self.write().await?;
        let task = store::tasks::get(w.conn(), task_id).await?.ok_or(Error::TaskNotFound(task_id))?;
        // A report that does not fit its task is refused even when repeated: it is malformed,
        // whatever became of the task.
        check_fits(&task, reported)?;
        let now = w.now();
        if !store::workers::touch(w.conn(), worker, now).await? {
            return Err(Error::WorkerNotFound(worker));
        }
        if task.state == TaskState::Done {
            w.commit(&self.events).await?;
            tracing::debug!(worker, task = task_id, "duplicate report dropped");
            return Ok(Report { stored: false, record_id: task.record_id });
        }
        if task.worker_id != Some(worker) {
            let holder = if task.state == TaskState::Leased { task.worker_id } else { None };
            return Err(Error::NotHolder { worker, task: task_id, holder });
        }
        // The same worker may hold a later lease of the task (its earlier one expired): while that
        // lease runs, a result of the earlier one is stale. Once no lease runs, the last holder's
        // late result is kept, whichever of its leases it answers (nothing measured is lost).
        // Serial 0 comes from workers that predate serials: the holder check alone applies.
        if lease_serial != 0 && lease_serial != task.attempts && task.state == TaskState::Leased {
            return Err(Error::StaleLease { task: task_id, reported: lease_serial, current: task.attempts });
        }
        let job = store::jobs::get(w.conn(), task.job_id).await?.ok_or(Error::JobNotFound(task.job_id))?;
        let record = match reported {
            Reported::Tuning(m) => self.record_result(&mut w, &job, &task, Some(worker), m).await?,
            Reported::Finalists(ms) => self.record_finalists(&mut w, &job, &task, Some(worker), ms).await?,
        };
        w.commit(&self.events).await?;
        match reported {
            Reported::Tuning(m) => {
                tracing::debug!(worker, task = task_id, job = job.id, record, status = ?m.status, median_us = m.median_us, "result stored");
            }
            Reported::Finalists(ms) => {
                tracing::debug!(
                    worker,
                    task = task_id,
                    job = job.id,
                    record,
                    finalists = ms.len(),
                    "finalist results stored"
                );
            }
        }
        Ok(Report { stored: true, record_id: Some(record) })
    }

    /// Every registered worker, with its drift from the online workers of its class.
    pub(crate) async fn workers(&self) -> Result<Vec<(WorkerRow, Drift)>> {
        let rows = store::workers::list(&self.pool).await?;
        let drifts = drift::assess_all(&rows);
        Ok(rows.into_iter().zip(drifts).collect())
    }
}

/// Checks that a report has the shape its task asks for: one measurement for a tuning task, one
/// per finalist, in the task's order, for a finalist task.
fn check_fits(task: &TaskRow, reported: &Reported) -> Result<()> {
    let finalists = task.finalists.0.len();
    match (task.kind, reported) {
        (TaskKind::Tuning, Reported::Tuning(_)) => Ok(()),
        (TaskKind::Tuning, Reported::Finalists(_)) => Err(Error::invalid(
            "finalist_measurements",
            format!(
                "task {} is a tuning task; report its one measurement in measurement and leave \
                 finalist_measurements empty",
                task.id
            ),
        )),
        (TaskKind::Finalist, Reported::Tuning(_)) => Err(Error::invalid(
            "finalist_measurements",
            format!(
                "task {} is a finalist task; report one measurement per finalist ({finalists}) in \
                 finalist_measurements, in the task's order, and leave measurement unset",
                task.id
            ),
        )),
        (TaskKind::Finalist, Reported::Finalists(ms)) if ms.len() != finalists => Err(Error::invalid(
            "finalist_measurements",
            format!(
                "holds {} measurements but task {} has {finalists} finalists; report one per finalist, in \
                 the task's order",
                ms.len(),
                task.id
            ),
        )),
        (TaskKind::Finalist, Reported::Finalists(_)) => Ok(()),
    }
}
