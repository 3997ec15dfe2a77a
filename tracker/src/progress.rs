//! How a job advances inside a write: the tuner proposes tasks (reusing identical records), each
//! finished task updates its workload's progress, best and early-stopping state, a workload whose
//! tuning ended re-measures its finalists (`finalists.rs`), and a job whose workloads all finished
//! is done.

use tensortune_kernels::Template;

use crate::error::{Error, Result};
use crate::model::{JobState, Measurement, RecordId, Status, WorkerId, WorkloadState};
use crate::search::{self, Search};
use crate::store::jobs::JobRow;
use crate::store::records::{ContentKey, NewRecord, Outcome};
use crate::store::tasks::{NewTask, TaskRow};
use crate::store::workloads::WorkloadRow;
use crate::store::{self};
use crate::tracker::{Tracker, Write};

/// The template a stored job names, as built into this tracker.
pub(crate) fn template_of(job: &JobRow) -> Result<&'static dyn Template> {
    let template = tensortune_kernels::template::by_name(&job.template).map_err(|_| {
        Error::Precondition(format!("template {:?} is not built into this tracker; resubmit the job", job.template))
    })?;
    if template.version() != job.template_version {
        return Err(Error::Precondition(format!(
            "job {} tunes {} v{}, but this tracker builds v{}; resubmit the job to tune the new version",
            job.id,
            job.template,
            job.template_version,
            template.version()
        )));
    }
    Ok(template)
}

impl Tracker {
    /// Workload `idx` of `job`, which must exist.
    pub(crate) async fn workload(&self, w: &mut Write<'_>, job: &JobRow, idx: u32) -> Result<WorkloadRow> {
        store::workloads::get(w.conn(), job.id, idx)
            .await?
            .ok_or_else(|| Error::Internal(format!("workload {idx} of job {} is missing from the store", job.id)))
    }

    /// Loads the search of a workload if it is not in memory (after a restart, or a failed write).
    pub(crate) async fn ensure_search(&self, w: &mut Write<'_>, job: &JobRow, wl: &WorkloadRow) -> Result<()> {
        let key = (job.id, wl.idx);
        if w.search(key).is_some() {
            return Ok(());
        }
        let template = template_of(job)?;
        let target = store::classes::target(w.conn(), &job.device_class).await?.ok_or_else(|| {
            Error::Internal(format!("device class {:?} of job {} is missing from the store", job.device_class, job.id))
        })?;
        let valid = search::valid_configs(template, vec![wl.workload.0], target).await?.map_err(|(_, e)| {
            Error::Internal(format!("the space of workload {} of job {} cannot be enumerated: {e}", wl.idx, job.id))
        })?;
        let taken = store::tasks::taken(w.conn(), job.id, wl.idx).await?;
        let search = Search::new(job.tuner, job.seed(), wl.idx, valid[0].clone(), taken.into_iter().map(|c| c as u64));
        w.insert_search(key, search);
        Ok(())
    }

    /// Proposes tasks for workload `idx` until `batch_size` are outstanding or its whole target has
    /// been proposed. A config with an earlier deterministic record gets a task that is done at
    /// once, pointing at that record, so it counts as a trial without being measured again.
    pub(crate) async fn top_up(&self, w: &mut Write<'_>, job: &JobRow, idx: u32) -> Result<()> {
        if !job.is_active() {
            return Ok(());
        }
        let template = template_of(job)?;
        let space = template.space();
        loop {
            let wl = self.workload(w, job, idx).await?;
            if wl.state != WorkloadState::Running {
                return Ok(());
            }
            let outstanding = store::tasks::outstanding(w.conn(), job.id, idx).await?;
            let want = job.batch_size.saturating_sub(outstanding).min(wl.trials_target.saturating_sub(wl.proposed));
            if want == 0 {
                return Ok(());
            }
            self.ensure_search(w, job, &wl).await?;
            let configs = w.propose((job.id, idx), want as usize);
            if configs.is_empty() {
                return Err(Error::Internal(format!(
                    "workload {idx} of job {} ran out of configs after {} of {}",
                    job.id, wl.proposed, wl.trials_target
                )));
            }
            let mut inserted = 0;
            let mut pending = 0;
            for index in configs {
                let config = space
                    .config(index)
                    .map_err(|e| Error::Internal(format!("config {index} of {}: {e}", job.template)))?
                    .to_json();
                let key = ContentKey {
                    workload_key: &wl.workload_key,
                    template: &job.template,
                    template_version: job.template_version,
                    device_class: &job.device_class,
                    config: &config,
                };
                let reuse = store::records::reusable(w.conn(), &key).await?;
                let task = NewTask {
                    job_id: job.id,
                    workload_idx: idx,
                    config_index: index,
                    config: &config,
                    reuses: reuse.map(|r| r.id),
                };
                let now = w.now();
                store::tasks::insert(w.conn(), &task, now).await?;
                w.proposed((job.id, idx), index);
                inserted += 1;
                match reuse {
                    None => pending += 1,
                    Some(outcome) => {
                        if self.finish_trial(w, job, idx, outcome, true).await? != WorkloadState::Running {
                            break;
                        }
                    }
                }
            }
            store::workloads::add_proposed(w.conn(), job.id, idx, inserted).await?;
            if pending > 0 {
                w.tasks_ready();
            }
            w.job_changed(job.id);
            tracing::debug!(job = job.id, workload = idx, proposed = inserted, pending, "proposed tasks");
        }
    }

    /// Stores the record of a finished task, counts it, and proposes what comes next.
    pub(crate) async fn record_result(
        &self,
        w: &mut Write<'_>,
        job: &JobRow,
        task: &TaskRow,
        worker: Option<WorkerId>,
        measurement: &Measurement,
    ) -> Result<RecordId> {
        let wl = self.workload(w, job, task.workload_idx).await?;
        let record = NewRecord {
            task_id: task.id,
            job_id: job.id,
            worker_id: worker,
            workload: &wl.workload.0,
            template: &job.template,
            template_version: job.template_version,
            config: &task.config,
            config_index: task.config_index,
            device_class: &job.device_class,
            measurement,
            finalist: None,
        };
        let now = w.now();
        let id = store::records::insert(w.conn(), &record, now).await?;
        store::tasks::complete(w.conn(), task.id, id, now).await?;
        let outcome = Outcome { id, status: measurement.status, median_us: measurement.median_us };
        self.finish_trial(w, job, task.workload_idx, outcome, false).await?;
        self.top_up(w, job, task.workload_idx).await?;
        Ok(id)
    }

    /// Counts a finished task of workload `idx`: progress, best record, early stopping, and the end
    /// of its tuning when it reached its target (then its finalists, or the end of the workload and
    /// perhaps of the job). Returns the workload's state.
    async fn finish_trial(
        &self,
        w: &mut Write<'_>,
        job: &JobRow,
        idx: u32,
        outcome: Outcome,
        reused: bool,
    ) -> Result<WorkloadState> {
        let mut wl = self.workload(w, job, idx).await?;
        wl.done += 1;
        wl.reused += u32::from(reused);
        if outcome.status == Status::Ok {
            let t = outcome.median_us;
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
        let now = w.now();
        if let Some(end) = ended {
            let cancelled = store::tasks::cancel_unfinished(w.conn(), job.id, Some(idx), now).await?;
            w.stop_search(job.id, Some(idx));
            wl.state = end;
            let finalizing = self.start_finalists(w, job, &mut wl, end).await?;
            tracing::info!(
                job = job.id,
                workload = idx,
                state = end.name(),
                finalizing,
                trials = wl.done,
                best_us = wl.best_us,
                cancelled,
                "workload tuning finished"
            );
        }
        store::workloads::save_progress(w.conn(), &wl).await?;
        store::jobs::touch(w.conn(), job.id, now).await?;
        w.job_changed(job.id);
        if ended.is_some() {
            self.finish_job_if_done(w, job).await?;
        }
        Ok(wl.state)
    }

    /// Marks the job done when none of its workloads is tuning or finalizing any more. Notes on
    /// the way (workloads that finished without finalists) stay in its error text.
    pub(crate) async fn finish_job_if_done(&self, w: &mut Write<'_>, job: &JobRow) -> Result<()> {
        let current = store::jobs::get(w.conn(), job.id).await?.ok_or(Error::JobNotFound(job.id))?;
        if current.state.is_terminal() || store::workloads::unfinished(w.conn(), job.id).await? > 0 {
            return Ok(());
        }
        let now = w.now();
        store::jobs::finish(w.conn(), job.id, JobState::Done, &current.error, now).await?;
        w.stop_search(job.id, None);
        w.job_changed(job.id);
        tracing::info!(job = job.id, "job done");
        Ok(())
    }
}
