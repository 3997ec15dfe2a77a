//! Lease upkeep: the reaper that returns expired leases to the queue (or gives up on a task whose
//! workers keep dying), and the resume step that picks up every unfinished job at start.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::changes::Renewal;
use crate::dispatch::Producer;
use crate::error::Result;
use crate::model::{JobState, Measurement, TaskKind, WorkerId, WorkloadState, now_ms};
use crate::progress::JobTemplates;
use crate::store::{self};
use crate::tracker::{Tracker, millis};

/// The shortest reaper period: a very short lease (tests) must not turn the reaper into a spin.
const MIN_REAP_PERIOD: Duration = Duration::from_millis(10);

/// Runs the reaper every quarter lease until `shutdown`.
pub(crate) async fn reaper(tracker: Arc<Tracker>, shutdown: CancellationToken) {
    // A quarter lease: an expired task waits at most that long beyond its lease to be re-leased.
    let period = (tracker.config.lease / 4).max(MIN_REAP_PERIOD);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = tick.tick() => {
                if let Err(e) = tracker.reap().await {
                    let e = tracker.noting_outage(e);
                    tracing::error!(error = %e, "lease reaper failed; retrying next period");
                }
            }
        }
    }
    tracing::debug!("lease reaper stopped");
}

impl Tracker {
    /// Returns expired leases to the queue; a tuning task whose lease expired `max_attempts` times
    /// gets a `device_lost` record instead, and a finalist task is given up on. Marks workers not heard from for a lease offline.
    pub(crate) async fn reap(&self) -> Result<()> {
        let w = self.write().await?;
        // Checked once the writer lock is held: a reap that waited for it through an outage must
        // not expire the leases whose heartbeats the outage refused.
        if self.outage.swap(false, std::sync::atomic::Ordering::AcqRel) {
            return self
                .renew_after_outage(w)
                .await
                .inspect_err(|_| self.outage.store(true, std::sync::atomic::Ordering::Release));
        }
        // Heartbeats renewed leases in memory: stored first, in this write, so that none of them
        // expires; kept for the next reap when this one fails.
        let renewals = self.renewals.take();
        let reaped = self.reap_in(w, &renewals).await;
        if reaped.is_err() {
            self.renewals.restore(renewals);
        }
        reaped
    }

    /// The reap of [`Tracker::reap`] in `w`, after storing `renewals`.
    async fn reap_in(&self, mut w: crate::tracker::Write<'_>, renewals: &HashMap<WorkerId, Renewal>) -> Result<()> {
        let now = w.now();
        self.store_renewals(&mut w, renewals).await?;
        let expired = store::tasks::expired(w.conn(), now).await?;
        let count = expired.len() as u64;
        for task in expired {
            if task.attempts >= self.config.max_attempts {
                let Some(job) = store::jobs::get(w.conn(), task.job_id).await? else { continue };
                if task.kind == TaskKind::Finalist {
                    // Re-measuring is a refinement: its workload finishes on its tuning records.
                    self.give_up_finalists(&mut w, &job, &task).await?;
                    continue;
                }
                let why = format!("lease expired {} times; the worker holding it was lost", task.attempts);
                let producer = Producer { worker: task.worker_id, token: None, untrusted: &[] };
                let record = self.record_result(&mut w, &job, &task, &producer, &Measurement::device_lost(why)).await?;
                self.advance(&mut w, &job, task.workload_idx).await?;
                tracing::warn!(
                    task = task.id,
                    job = job.id,
                    worker = task.worker_id,
                    attempts = task.attempts,
                    record,
                    "task lost its worker too often; recorded as device_lost"
                );
            } else {
                store::tasks::release(w.conn(), task.id, now).await?;
                w.tasks_ready(1);
                tracing::info!(
                    task = task.id,
                    job = task.job_id,
                    worker = task.worker_id,
                    attempts = task.attempts,
                    "lease expired; task back in the queue"
                );
            }
        }
        let offline = store::workers::mark_offline(w.conn(), now.saturating_sub(millis(self.config.lease))).await?;
        w.commit(&self.events).await?;
        self.counters.leases_expired.fetch_add(count, std::sync::atomic::Ordering::Relaxed);
        for worker in offline {
            tracing::info!(worker, "worker offline: not heard from for a lease");
        }
        Ok(())
    }

    /// Stores the renewals heartbeats noted in memory (see `changes::Renewals`): each worker's
    /// leases among its noted tasks run to its latest deadline, and it was seen then.
    async fn store_renewals(
        &self,
        w: &mut crate::tracker::Write<'_>,
        renewals: &HashMap<WorkerId, Renewal>,
    ) -> Result<()> {
        for (&worker, r) in renewals {
            if !r.tasks.is_empty() {
                let tasks: Vec<_> = r.tasks.iter().copied().collect();
                store::tasks::renew(w.conn(), worker, &tasks, r.expires_ms).await?;
            }
        }
        let mut seen: Vec<(WorkerId, i64)> = renewals.iter().map(|(&worker, r)| (worker, r.seen_ms)).collect();
        seen.sort_unstable();
        store::workers::seen_at(w.conn(), &seen).await
    }

    /// Once the database can be written again after an outage: every lease runs a whole lease
    /// from now, as after a restart, so that workers whose heartbeats failed meanwhile can still
    /// report what they hold instead of having it measured again.
    async fn renew_after_outage(&self, mut w: crate::tracker::Write<'_>) -> Result<()> {
        let expires = self.lease_deadline(w.now());
        let renewed = store::tasks::renew_all(w.conn(), expires).await?;
        w.commit(&self.events).await?;
        tracing::warn!(leases = renewed, "the database takes writes again; every lease renewed for a whole lease");
        Ok(())
    }

    /// Picks up where a previous tracker on this database stopped: leased tasks get a fresh lease
    /// (their workers may have survived and will report), and every unfinished job gets its
    /// searches rebuilt and its batches topped up. Finalizing workloads need nothing: their
    /// finalist task is in the tasks table, pending or leased. A job whose template version this build no
    /// longer has fails with the reason.
    pub(crate) async fn resume(&self) -> Result<()> {
        let mut w = self.write().await?;
        let now = w.now();
        let jobs = store::jobs::active(w.conn()).await?;
        for job in &jobs {
            if let Err(why) = JobTemplates::of(job) {
                store::tasks::cancel_unfinished(w.conn(), job.id, None, now).await?;
                store::jobs::finish(w.conn(), job.id, JobState::Failed, &why.to_string(), now).await?;
                w.job_changed(job.id);
                tracing::warn!(job = job.id, error = %why, "job failed on resume");
                continue;
            }
            for wl in store::workloads::list(w.settled().await?, job.id).await? {
                if wl.state == WorkloadState::Running {
                    // Enumerated now rather than at the first report, which would hold every
                    // writer up while it walks the space.
                    self.ensure_search(&mut w, job, &wl).await?;
                }
            }
            self.top_up_all(&mut w, job).await?;
            self.finish_job_if_done(&mut w, job).await?;
        }
        // Every lease held when the tracker stopped gets a whole lease from the moment serving
        // starts, read after the searches were rebuilt: a deadline taken at the start of this write
        // would let the seconds spent enumerating spaces eat the leases of workers still
        // reconnecting, and their work would be measured twice.
        let renewed = store::tasks::renew_all(w.conn(), self.lease_deadline(now_ms())).await?;
        w.commit(&self.events).await?;
        tracing::info!(jobs = jobs.len(), leases = renewed, "resumed unfinished jobs");
        Ok(())
    }
}
