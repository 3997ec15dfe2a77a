//! Dispatch to workers: registration, leasing with long polls, heartbeats and reports.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::auth::Caller;
use crate::changes::{Done, Op, Report, ReportItem};
use crate::counters::Counters;
use crate::drift::{self, Drift, FlagChange};
use crate::error::{Error, Result};
use crate::model::{
    JobId, JobState, Measurement, Registration, Reported, Status, TaskId, TaskKind, TaskState, WorkerId,
};
use crate::plausible;
use crate::store::jobs::JobRow;
use crate::store::tasks::{LeasedTask, TaskRow};
use crate::store::workers::WorkerRow;
use crate::store::{self};
use crate::tracker::{Tracker, Write};

impl Tracker {
    /// Registers a worker (or re-registers one that passes its previous id, keeping its leases)
    /// and records its device class.
    pub(crate) async fn register(&self, reg: &Registration, caller: &Caller) -> Result<WorkerId> {
        let mut w = self.write().await?;
        let now = w.now();
        if let Some(previous) = reg.previous_id
            && let Some(row) = store::workers::get(w.conn(), previous).await?
        {
            authorize(caller, &row)?;
        }
        store::classes::upsert(w.conn(), &reg.device.target, now).await?;
        if self.config.prior_pack && crate::packs::takes_shipped(&reg.device.target.class_key) {
            crate::packs::warm();
        }
        if reg.previous_id.is_some() {
            // A new worker changes no kept row; one registering again may change its own.
            w.worker_changed();
        }
        let id = match reg.previous_id {
            Some(previous) if store::workers::reregister(w.conn(), previous, reg, now).await? => previous,
            _ => store::workers::insert(w.conn(), reg, caller.token, now).await?,
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
    pub(crate) async fn lease(
        &self,
        worker: WorkerId,
        max: u32,
        wait: Duration,
        caller: &Caller,
    ) -> Result<Vec<LeasedTask>> {
        let deadline = Instant::now() + wait;
        loop {
            // Registered before looking, so that tasks proposed between the look and the wait
            // still wake this call.
            let ready = self.events.next_tasks();
            tokio::pin!(ready);
            ready.as_mut().enable();
            let tasks = match self.try_lease(worker, max, caller, deadline).await {
                Ok(tasks) => tasks,
                Err(e) => {
                    // This call may have taken a wake meant for tasks it now leaves pending.
                    self.events.pass_on();
                    return Err(e);
                }
            };
            if u32::try_from(tasks.len()).is_ok_and(|n| n >= max) {
                // All it asked for: more may be pending, and waiters were woken only for some.
                self.events.pass_on();
            }
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

    async fn try_lease(&self, worker: WorkerId, max: u32, caller: &Caller, until: Instant) -> Result<Vec<LeasedTask>> {
        match self.commit_op(Op::Lease { worker, max, caller: caller.clone(), until: until.into_std() }).await? {
            Done::Leased(tasks) => {
                if !tasks.is_empty() {
                    tracing::debug!(worker, tasks = tasks.len(), "leased tasks");
                }
                Ok(tasks)
            }
            _ => Err(Error::Internal("a lease was answered with another change's outcome".to_owned())),
        }
    }

    /// The lease of [`Tracker::lease`] inside a group's write (see `commits`): the outer error
    /// fails the group, the inner one refuses this lease alone.
    pub(crate) async fn lease_in(
        &self,
        w: &mut Write<'_>,
        worker: WorkerId,
        max: u32,
        caller: &Caller,
    ) -> Result<Result<Vec<LeasedTask>>> {
        let now = w.now();
        let row = match self.checked_worker(w, worker, caller).await? {
            Ok(row) => row,
            Err(refused) => return Ok(Err(refused)),
        };
        let expires = self.lease_deadline(now);
        let mut leased =
            store::tasks::lease(w.conn(), worker, &row.device_class, &row.templates.0, max, expires, now).await?;
        // The lease took (or already held) each one's job lock.
        for t in &leased {
            w.hold(t.job_id);
        }
        // Finalist tasks spread over the class's workers ([`FINALISTS_HELD`]): only a lease that
        // took one can go over the share.
        if leased.iter().any(|t| t.kind == TaskKind::Finalist) {
            let ids: Vec<TaskId> = leased.iter().map(|t| t.id).collect();
            let back = finalists_over_share(w, worker, &row.device_class, &ids).await?;
            if !back.is_empty() {
                store::tasks::unlease(w.conn(), &back, now).await?;
                leased.retain(|t| !back.contains(&t.id));
                // They wake other workers' waiting leases, but only from a lease that is answered:
                // one answered empty waits for the next event instead of waking itself again.
                if !leased.is_empty() {
                    w.tasks_ready(back.len() as u64);
                }
            }
        }
        w.leased(leased.len() as u64);
        // What the worker needs of each task's job and workload, from the rows the write keeps
        // (the group's reports read them already, mostly): a statement per lease before.
        let mut tasks = Vec::with_capacity(leased.len());
        let mut queued = Vec::new();
        for t in leased {
            let job = self.job_in(w, t.job_id).await?;
            let wl = self.workload(w, &job, t.workload_idx).await?;
            // A job is queued only until its first lease: most leases change no job row.
            if job.state == JobState::Queued && !queued.contains(&job.id) {
                queued.push(job.id);
            }
            tasks.push(LeasedTask {
                id: t.id,
                job_id: t.job_id,
                workload: wl.workload,
                workload_key: wl.workload_key,
                template: t.template,
                template_version: t.template_version,
                config: t.config,
                config_index: t.config_index,
                samples: job.samples,
                lease_expires_ms: t.lease_expires_ms,
                flush_l2: job.flush_l2,
                regime: job.regime.clone(),
                no_energy: job.no_energy,
                kind: t.kind,
                finalists: t.finalists,
                finalist_rounds: job.finalist_rounds,
                attempts: t.attempts,
            });
        }
        if !queued.is_empty() {
            for job in store::jobs::mark_running(w.conn(), &queued, now).await? {
                w.forget_job(job);
                w.job_changed(job);
                tracing::info!(job, "job running");
            }
        }
        Ok(Ok(tasks))
    }

    /// Worker `worker`'s row when `caller` may act as it (the inner error otherwise), read once per
    /// write however many of the worker's calls it holds, and noted seen now. The note is kept in
    /// memory with the heartbeats' renewals (`changes::Renewals`) and stored by the reaper before
    /// it marks anyone offline: a statement per worker per group before, one in six of the
    /// tracker's statements at 1,000 workers.
    async fn checked_worker(&self, w: &mut Write<'_>, worker: WorkerId, caller: &Caller) -> Result<Result<WorkerRow>> {
        let row = match w.workers.get(&worker) {
            Some(row) => row.clone(),
            None => {
                let Some(row) = self.worker_row(w.conn(), worker).await? else {
                    return Ok(Err(Error::WorkerNotFound(worker)));
                };
                row
            }
        };
        if let Err(refused) = authorize(caller, &row) {
            return Ok(Err(refused));
        }
        if !w.workers.contains_key(&worker) {
            self.renewals.seen(worker, w.now());
            w.workers.insert(worker, row.clone());
        }
        Ok(Ok(row))
    }

    /// Renews the leases `worker` holds among `tasks` and stores its latest reference time (when it
    /// has one); returns the tasks it should drop (leased to another worker, done, cancelled or
    /// unknown), in the order given.
    ///
    /// Without a new reference time this writes nothing and waits for no write: it reads which of
    /// the tasks the worker holds and notes the renewal in memory (`changes::Renewals`), which the
    /// reaper stores before it expires anything. A new reference time re-judges the worker's drift,
    /// a write: that heartbeat goes through the group commit.
    pub(crate) async fn heartbeat(
        &self,
        worker: WorkerId,
        tasks: &[TaskId],
        reference_us: Option<f64>,
        caller: &Caller,
    ) -> Result<Vec<TaskId>> {
        let row = self.worker_row(&self.pool, worker).await?.ok_or(Error::WorkerNotFound(worker))?;
        authorize(caller, &row)?;
        let renewed: HashSet<TaskId> = match reference_us {
            Some(r) if row.reference_us != Some(r) => {
                let op = Op::Heartbeat { worker, tasks: tasks.to_vec(), reference_us, caller: caller.clone() };
                let Done::Beat(renewed, flag) = self.commit_op(op).await? else {
                    return Err(Error::Internal("a heartbeat was answered with another change's outcome".to_owned()));
                };
                if let Some(change) = flag {
                    change.log();
                }
                renewed
            }
            _ => {
                let held =
                    if tasks.is_empty() { Vec::new() } else { store::tasks::held(&self.pool, worker, tasks).await? };
                let now = crate::model::now_ms();
                self.renewals.note(worker, &held, now, self.lease_deadline(now));
                held.into_iter().collect()
            }
        };
        let mut seen = HashSet::new();
        let drop: Vec<TaskId> = tasks.iter().copied().filter(|t| !renewed.contains(t) && seen.insert(*t)).collect();
        if !drop.is_empty() {
            tracing::debug!(worker, drop = ?drop, "heartbeat: tasks to drop");
        }
        Ok(drop)
    }

    /// The heartbeat of [`Tracker::heartbeat`] inside a group's write: the renewed leases and the
    /// worker's drift flag if it changed.
    pub(crate) async fn heartbeat_in(
        &self,
        w: &mut Write<'_>,
        worker: WorkerId,
        tasks: &[TaskId],
        reference_us: Option<f64>,
        caller: &Caller,
    ) -> Result<Result<(HashSet<TaskId>, Option<FlagChange>)>> {
        let now = w.now();
        if let Err(refused) = self.checked_worker(w, worker, caller).await? {
            return Ok(Err(refused));
        }
        let flag = match reference_us {
            Some(r) => note_reference(w, worker, r).await?,
            None => None,
        };
        let renewed: HashSet<TaskId> = if tasks.is_empty() {
            HashSet::new()
        } else {
            let expires = self.lease_deadline(now);
            store::tasks::renew(w.conn(), worker, tasks, expires).await?.into_iter().collect()
        };
        Ok(Ok((renewed, flag)))
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
        reported: Reported,
        caller: &Caller,
    ) -> Result<Report> {
        let one = ReportItem { task: task_id, lease_serial, reported: Ok(reported) };
        let mut outcomes = self.report_batch(worker, vec![one], caller).await?;
        outcomes.pop().unwrap_or_else(|| Err(Error::Internal("a report of one task had no outcome".to_owned())))
    }

    /// Stores a batch of reports of `worker` in one write (one transaction, one commit: group
    /// commit), each as [`Tracker::report`] would, and answers each in the batch's order. A report
    /// refused for good (malformed, stale, not the holder's, an unknown task) gets its error in its
    /// own outcome and changes nothing; the others are stored. A failure of the write itself (the
    /// database) fails the whole batch, of which nothing is then stored: the worker retries it,
    /// and the reports that reached the database before are acknowledged as duplicates.
    pub(crate) async fn report_batch(
        &self,
        worker: WorkerId,
        items: Vec<ReportItem>,
        caller: &Caller,
    ) -> Result<Vec<Result<Report>>> {
        match self.commit_op(Op::Report { worker, items, caller: caller.clone() }).await? {
            Done::Reported(outcomes) => {
                // Counted once committed (a group that fails is run again).
                for r in outcomes.iter().flatten() {
                    let counter =
                        if r.stored { &self.counters.reports_stored } else { &self.counters.reports_duplicate };
                    Counters::bump(counter);
                    if r.untrusted {
                        Counters::bump(&self.counters.reports_untrusted);
                    }
                }
                Ok(outcomes)
            }
            _ => Err(Error::Internal("a report was answered with another change's outcome".to_owned())),
        }
    }

    /// The reports of [`Tracker::report_batch`] inside a group's write.
    pub(crate) async fn report_in(
        &self,
        w: &mut Write<'_>,
        worker: WorkerId,
        items: &[ReportItem],
        caller: &Caller,
    ) -> Result<Result<Vec<Result<Report>>>> {
        let mut answers = self.reports_in(w, &[(worker, items, caller)]).await?;
        answers.pop().ok_or_else(|| Error::Internal("a batch of reports had no answer".to_owned()))
    }

    /// The report batches `batches` (each a call's: its worker, its reports, its caller) inside a
    /// group's write, as one batch: one read of all their tasks, their records inserted together
    /// and their tasks marked done together, and one proposal per workload after all of them.
    /// Answers each batch as [`Tracker::report_in`] would have alone, in `batches`' order.
    ///
    /// A group held ~30 report calls of 3-8 tasks each (a worker reports what finished while its
    /// last report waited), and each call read its tasks, inserted its records (a statement per
    /// power of two), marked its tasks done and proposed for its workloads on its own: each a
    /// statement, and each statement a round trip on the one writer's path.
    pub(crate) async fn reports_in(
        &self,
        w: &mut Write<'_>,
        batches: &[(WorkerId, &[ReportItem], &Caller)],
    ) -> Result<Vec<Result<Vec<Result<Report>>>>> {
        // Each batch's worker is checked first; a refused batch is answered alone and writes
        // nothing. The others' reports go on as one batch, each knowing its own.
        let mut answers: Vec<Result<Vec<Result<Report>>>> = Vec::with_capacity(batches.len());
        let mut reporters = Vec::with_capacity(batches.len());
        for &(worker, _, caller) in batches {
            match self.checked_worker(w, worker, caller).await? {
                Ok(row) => {
                    answers.push(Ok(Vec::new()));
                    reporters.push(Some((row, caller.token)));
                }
                Err(refused) => {
                    answers.push(Err(refused));
                    reporters.push(None);
                }
            }
        }
        let all: Vec<(usize, &ReportItem)> = batches
            .iter()
            .enumerate()
            .filter(|(b, _)| reporters[*b].is_some())
            .flat_map(|(b, (_, items, _))| items.iter().map(move |i| (b, i)))
            .collect();
        // The tasks in one read (one per report before). Each row serves its report once (a task
        // repeated is read again), and a report that stopped a workload or a job, which cancels
        // other tasks, makes the rest read theirs again.
        let ids: Vec<TaskId> = all.iter().filter(|(_, i)| i.reported.is_ok()).map(|(_, i)| i.task).collect();
        let mut rows: HashMap<TaskId, TaskRow> = if ids.len() > 1 {
            store::tasks::get_many(w.conn(), &ids).await?.into_iter().map(|t| (t.id, t)).collect()
        } else {
            HashMap::new()
        };
        // The workloads whose trials finished, in order: each proposes what follows once all the
        // reports are in (once per report before: a proposal of one config, three statements).
        let mut next: Vec<(JobId, u32)> = Vec::new();
        // Tuning records to store: inserted together, their tasks marked done together, then
        // counted in the reports' order. `waiting` holds the place of each one's outcome (its
        // batch, its place there), which gets its record's id then.
        let mut stored = Vec::new();
        let mut stored_tasks = HashSet::new();
        let mut waiting: Vec<(usize, usize)> = Vec::new();
        let mut outcomes: Vec<Vec<Result<Report>>> =
            batches.iter().map(|(_, items, _)| Vec::with_capacity(items.len())).collect();
        for (b, item) in all {
            let Some((row, token)) = &reporters[b] else { unreachable!("a refused batch's reports are left out") };
            let worker = row.id;
            // A finalist report decides its workload on the records counted so far, and a task
            // named again must find the first report of it done: the stored ones are counted first.
            if matches!(item.reported, Ok(Reported::Finalists(_))) || stored_tasks.contains(&item.task) {
                stored_tasks.clear();
                let (ids, stopped) = self.complete_stored(w, &mut stored).await?;
                record_ids(&mut outcomes, &mut waiting, &ids);
                if stopped {
                    rows.clear();
                }
            }
            let read = rows.remove(&item.task);
            let checked = match &item.reported {
                Ok(reported) => self.check_report(w, worker, item.task, item.lease_serial, reported, read).await,
                Err(refused) => Err(refused.again()),
            };
            let task = match checked {
                Ok(Checked::Store(task)) => task,
                Ok(Checked::Done(report)) => {
                    tracing::debug!(worker, task = item.task, "duplicate report dropped");
                    outcomes[b].push(Ok(report));
                    continue;
                }
                // Refused for good: nothing of it was written, so the batch goes on without it.
                Err(e) if e.refusal() => {
                    outcomes[b].push(Err(e));
                    continue;
                }
                Err(e) => return Err(e),
            };
            let Ok(reported) = &item.reported else { unreachable!("a refused report is never stored") };
            let job = self.job_in(w, task.job_id).await?;
            let untrusted = judge(w, &task, row, reported).await?;
            for reason in untrusted.iter().flatten() {
                tracing::warn!(worker, task = task.id, job = job.id, %reason, "report not trusted");
            }
            let producer = Producer { worker: Some(worker), token: *token, untrusted: &untrusted };
            // From here on a failure may leave half a report in the transaction: it fails the
            // whole group, which rolls back.
            let record = match reported {
                Reported::Tuning(m) => {
                    if !next.contains(&(job.id, task.workload_idx)) {
                        next.push((job.id, task.workload_idx));
                    }
                    let s = self.store_record(w, &job, &task, &producer, m, &stored).await?;
                    stored_tasks.insert(task.id);
                    stored.push((Arc::clone(&job), s));
                    waiting.push((b, outcomes[b].len()));
                    None
                }
                Reported::Finalists(ms) => {
                    let stops = w.stops();
                    let record = self.record_finalists(w, &job, &task, &producer, ms).await?;
                    if w.stops() != stops {
                        rows.clear();
                    }
                    Some(record)
                }
            };
            let untrusted = untrusted.iter().any(Option::is_some);
            tracing::debug!(worker, task = task.id, job = job.id, untrusted, "result stored");
            outcomes[b].push(Ok(Report { stored: true, record_id: record, untrusted }));
        }
        let (ids, _) = self.complete_stored(w, &mut stored).await?;
        record_ids(&mut outcomes, &mut waiting, &ids);
        for (job, idx) in next {
            let job = self.job_in(w, job).await?;
            self.advance(w, &job, idx).await?;
        }
        for (answer, out) in answers.iter_mut().zip(outcomes) {
            if let Ok(answer) = answer {
                *answer = out;
            }
        }
        Ok(answers)
    }

    /// Job `id`'s row, read once per write for its reports and leases (see `Write::job_row`).
    async fn job_in(&self, w: &mut Write<'_>, id: JobId) -> Result<Arc<JobRow>> {
        // Everything a dispatch change does to a job starts from its row, read here: a group's
        // write must hold the job first (`Tracker::write_dispatch`).
        w.holding(id)?;
        if let Some(job) = w.job_row(id) {
            return Ok(Arc::clone(job));
        }
        let job = Arc::new(store::jobs::get(w.conn(), id).await?.ok_or(Error::JobNotFound(id))?);
        w.remember_job(Arc::clone(&job));
        Ok(job)
    }

    /// The checks of one report of a batch, before anything of it is written: whether it fits its
    /// task, whether the task is done already (the report is then acknowledged and dropped), and
    /// whether `worker` may report it. `read` is the task's row when the batch read it already.
    async fn check_report(
        &self,
        w: &mut Write<'_>,
        worker: WorkerId,
        task_id: TaskId,
        lease_serial: u32,
        reported: &Reported,
        read: Option<TaskRow>,
    ) -> Result<Checked> {
        let task = match read {
            Some(task) => task,
            None => store::tasks::get(w.conn(), task_id).await?.ok_or(Error::TaskNotFound(task_id))?,
        };
        // A report that does not fit its task is refused even when repeated: it is malformed,
        // whatever became of the task.
        check_fits(&task, reported)?;
        if task.state == TaskState::Done {
            return Ok(Checked::Done(Report { stored: false, record_id: task.record_id, untrusted: false }));
        }
        if task.worker_id != Some(worker) {
            let holder = if task.state == TaskState::Leased { task.worker_id } else { None };
            return Err(Error::NotHolder { worker, task: task_id, holder });
        }
        // The same worker may hold a later lease of the task (its earlier one expired): while that
        // lease runs, a result of the earlier one is stale. Once no lease runs, the last holder's
        // late result is kept, whichever of its leases it answers (nothing measured is lost).
        if lease_serial > task.attempts {
            return Err(Error::invalid(
                "lease_serial",
                format!("{lease_serial} names a lease task {task_id} never had (it had {})", task.attempts),
            ));
        }
        if lease_serial != task.attempts && task.state == TaskState::Leased {
            return Err(Error::StaleLease { task: task_id, reported: lease_serial, current: task.attempts });
        }
        Ok(Checked::Store(Box::new(task)))
    }

    /// A worker that stops hands back every task it holds: they are pending again at once (and
    /// waiting leases are woken), and the worker is marked offline. Returns how many went back.
    /// Its earlier reports stay; a late report of a handed-back task is still accepted until
    /// another worker leases it, as after an expired lease.
    pub(crate) async fn leave(&self, worker: WorkerId, caller: &Caller) -> Result<u64> {
        let mut w = self.write().await?;
        let now = w.now();
        let row = store::workers::get(w.conn(), worker).await?.ok_or(Error::WorkerNotFound(worker))?;
        if !caller.owns(row.token_id) {
            return Err(Error::Denied(format!(
                "worker {worker} registered with another token; a worker token acts only for the workers it registered"
            )));
        }
        let released = store::tasks::release_worker(w.conn(), worker, now).await?;
        store::workers::set_offline(w.conn(), worker, now).await?;
        w.worker_changed();
        if released > 0 {
            w.tasks_ready(released);
        }
        w.commit(&self.events).await?;
        tracing::info!(worker, released, "worker left; its tasks are pending again");
        Ok(released)
    }

    /// Quarantines worker `id`: every record it produced becomes untrusted (workloads it was
    /// winning fall back to their fastest trusted record), the tasks it holds go back to the
    /// queue, and its further leases and reports are refused. Returns the records it marked.
    pub(crate) async fn quarantine(&self, id: WorkerId, reason: &str, caller: &Caller) -> Result<u64> {
        caller.require_admin("quarantining a worker")?;
        let mut w = self.write().await?;
        let now = w.now();
        let why = format!("quarantined: worker {id}: {reason}");
        w.worker_changed();
        if !store::workers::quarantine(w.conn(), id, reason).await? {
            return Err(Error::WorkerNotFound(id));
        }
        let marked = store::records::quarantine_worker(w.conn(), id, &why).await?;
        let affected = store::workloads::drop_untrusted_winners(w.settled().await?).await?;
        w.forget_workloads();
        for &(job, idx) in &affected {
            // Its searches saw the worker's times as trusted: they reload from the store.
            w.stop_search(job, Some(idx));
            w.job_changed(job);
        }
        let released = store::tasks::release_worker(w.conn(), id, now).await?;
        if released > 0 {
            w.tasks_ready(released);
        }
        w.commit(&self.events).await?;
        tracing::warn!(worker = id, records = marked, workloads = affected.len(), released, %reason, "worker quarantined");
        Ok(marked)
    }

    /// Every registered worker, with its drift from the online workers of its class.
    pub(crate) async fn workers(&self) -> Result<Vec<(WorkerRow, Drift)>> {
        let rows = store::workers::list(&self.pool).await?;
        let drifts = drift::assess_all(&rows);
        Ok(rows.into_iter().zip(drifts).collect())
    }
}

/// Gives the outcomes at the places `waiting` holds (a batch, a place in it) the ids of their
/// records, just inserted (in the same order); empties `waiting`.
fn record_ids(outcomes: &mut [Vec<Result<Report>>], waiting: &mut Vec<(usize, usize)>, ids: &[crate::model::RecordId]) {
    for ((b, at), id) in waiting.drain(..).zip(ids) {
        if let Some(Ok(report)) = outcomes.get_mut(b).and_then(|o| o.get_mut(at)) {
            report.record_id = Some(*id);
        }
    }
}

/// A report that passed its checks.
enum Checked {
    /// To store, in its task.
    Store(Box<TaskRow>),
    /// Its task is done already: acknowledged and dropped.
    Done(Report),
}

/// Who produced the records of a report, and which of its measurements are not trusted.
pub(crate) struct Producer<'a> {
    /// The reporting worker (`None` for records the tracker writes itself, `device_lost`).
    pub(crate) worker: Option<WorkerId>,
    /// The token it reported with.
    pub(crate) token: Option<i64>,
    /// Per measurement in the report's order: why it is not trusted, or `None`.
    pub(crate) untrusted: &'a [Option<String>],
}

impl Producer<'_> {
    /// Why measurement `i` is not trusted, if it is not.
    pub(crate) fn untrusted(&self, i: usize) -> Option<&str> {
        self.untrusted.get(i).and_then(|u| u.as_deref())
    }
}

/// Fails unless `caller` may act as worker `row`: the token it registered with (or an admin's),
/// and not quarantined.
fn authorize(caller: &Caller, row: &WorkerRow) -> Result<()> {
    if !caller.owns(row.token_id) {
        return Err(Error::Denied(format!(
            "worker {} registered with another token; a worker token acts only for the workers it registered",
            row.id
        )));
    }
    if let Some(why) = &row.quarantined {
        return Err(Error::Denied(format!("worker {} is quarantined ({why}); an admin must let it back", row.id)));
    }
    Ok(())
}

/// Stores `worker`'s latest reference time and re-judges its flag; returns the change to log, if
/// its flag changed. The worker was just heard from, so it counts among the online peers.
async fn note_reference(w: &mut Write<'_>, worker: WorkerId, reference_us: f64) -> Result<Option<FlagChange>> {
    w.worker_changed();
    store::workers::set_reference(w.conn(), worker, reference_us).await?;
    let Some(row) = store::workers::get_lean(w.conn(), worker).await? else { return Ok(None) };
    let peers = store::workers::class_references(w.conn(), &row.device_class).await?;
    let drift = drift::assess(Some(reference_us), &peers);
    if drift.flagged == row.drift_flagged {
        return Ok(None);
    }
    store::workers::set_drift_flagged(w.conn(), worker, drift.flagged).await?;
    Ok(Some(FlagChange {
        worker,
        name: row.name,
        device_class: row.device_class,
        reference_us,
        drift,
        peers: peers.len(),
    }))
}

/// Why each ok measurement of a report cannot be true (`crate::plausible`), in the report's order.
async fn judge(
    w: &mut Write<'_>,
    task: &TaskRow,
    worker: &WorkerRow,
    reported: &Reported,
) -> Result<Vec<Option<String>>> {
    let measurements: Vec<&Measurement> = match reported {
        Reported::Tuning(m) => vec![m],
        Reported::Finalists(ms) => ms.iter().collect(),
    };
    let device = &worker.device.0;
    if device.target.class_key == "sim" || measurements.iter().all(|m| m.status != Status::Ok) {
        return Ok(vec![None; measurements.len()]);
    }
    // Only the workload's shape is read, which never changes: no unsaved progress matters here.
    let workload = store::workloads::get(w.conn(), task.job_id, task.workload_idx)
        .await?
        .ok_or_else(|| Error::Internal(format!("task {} has no workload", task.id)))?
        .workload
        .0;
    let key = workload.key();
    let vendor_us = store::records::vendor_times(w.conn(), &key, &device.target.class_key, worker.id).await?;
    let mut out = Vec::with_capacity(measurements.len());
    for (i, m) in measurements.iter().enumerate() {
        if m.status != Status::Ok {
            out.push(None);
            continue;
        }
        let (template, version) = match reported {
            Reported::Tuning(_) => (task.template.as_str(), task.template_version),
            Reported::Finalists(_) => {
                let f = &task.finalists.0[i];
                (f.template.as_str(), f.template_version)
            }
        };
        let best_speedup = store::records::best_speedup(w.conn(), template, version, &device.target.class_key).await?;
        let history = plausible::History { vendor_us: vendor_us.clone(), best_speedup };
        out.push(plausible::judge(&workload, device, m.median_us, m.baseline_us, &history));
    }
    Ok(out)
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

/// The most finalist tasks a worker holds at once while another online worker of its class could
/// take the rest. A finalist task is a second or so of one GPU (interleaved rounds of a few
/// configs, each beside the vendor's), and a budgeted job's workloads end together when its budget
/// is spent: one lease of a worker with a wide compile pool took 12 of ResNet-50's 27 and measured
/// them one after another for 15 s while three GPUs idled (nvidia-h200-x4, 2026-11-28,
/// docs/data/gpu-2026-11-28-x4). Two keeps the next one ready while one measures.
const FINALISTS_HELD: usize = 2;

/// Of `leased`, the tasks just leased to `worker` in this write, those beyond [`FINALISTS_HELD`]
/// finalist tasks held: with another online worker in `class` they go back to the queue (the
/// caller answers the rest), so that finalists of different workloads spread over the GPUs.
async fn finalists_over_share(
    w: &mut Write<'_>,
    worker: WorkerId,
    class: &str,
    leased: &[TaskId],
) -> Result<Vec<TaskId>> {
    if leased.is_empty() {
        // Nothing new (an idle worker's lease): no statement.
        return Ok(Vec::new());
    }
    let held = store::tasks::leased_finalists(w.conn(), worker).await?;
    if held.len() <= FINALISTS_HELD || store::workers::online_in_class(w.conn(), class).await? < 2 {
        return Ok(Vec::new());
    }
    // Those held before this lease stay (the worker has them); of the new ones, the oldest first.
    let (new, before): (Vec<TaskId>, Vec<TaskId>) = held.into_iter().partition(|t| leased.contains(t));
    let keep = FINALISTS_HELD.saturating_sub(before.len());
    Ok(new.into_iter().skip(keep).collect())
}
