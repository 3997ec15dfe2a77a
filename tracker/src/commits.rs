//! Group commit of the dispatch calls: leases, heartbeats and reports of many workers share one
//! write (one transaction, one commit) instead of one each.
//!
//! A commit costs the database a sync to disk (about 3 ms on the CI machine's disk), and writes
//! are one at a time: with one transaction per call a tracker stores at most a few hundred calls a
//! second, however little each does. Here a call queues its change ([`Op`]) and waits; the
//! committer task takes the queued changes (in arrival order, up to a bounded amount of work:
//! `changes::Commits::take`) and runs them in one [`Write`], so the syncs per second stay the same
//! while the calls per sync grow with the load. Heartbeats do not queue here unless they carry a
//! new reference time: they renew leases in memory (`changes::Renewals`).
//!
//! Each change first checks what it can refuse (an unknown or quarantined worker, a stale report)
//! and answers such a refusal on its own, without writing. A failure after that (the database)
//! would fail every change of the group; the group is then rolled back and each change run again
//! alone, so that one change's failure fails only its own call.

use std::sync::Arc;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::changes::{Done, MAX_PUT_BACK, Op, Queued};
use crate::error::{Error, Result};
use crate::tracker::{Tracker, Write};

impl Tracker {
    /// Runs `op` in the next group commit; returns what it did once its group committed.
    pub(crate) async fn commit_op(&self, op: Op) -> Result<Done> {
        let (answer, done) = oneshot::channel();
        if self.commits.push(Queued { op, answer, put_back: 0 }).is_err() {
            return Err(Error::Unavailable("the tracker is shutting down; retry".to_owned()));
        }
        // The committer answers every change it takes, and takes every queued one before it stops.
        done.await.unwrap_or_else(|_| Err(Error::Unavailable("the tracker is shutting down; retry".to_owned())))
    }

    /// Notes that a group (or a change of one) committed now ([`Tracker::last_commit`]).
    fn note_commit(&self) {
        *self.last_commit.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(std::time::Instant::now());
    }

    /// Runs `op` inside `w`. The outer error fails the whole group (the database); the inner one
    /// refuses this change alone, which then wrote nothing.
    async fn apply(&self, w: &mut Write<'_>, op: &Op) -> Result<Result<Done>> {
        Ok(match op {
            Op::Lease { worker, max, caller, .. } => self.lease_in(w, *worker, *max, caller).await?.map(Done::Leased),
            Op::Heartbeat { worker, tasks, reference_us, caller } => self
                .heartbeat_in(w, *worker, tasks, *reference_us, caller)
                .await?
                .map(|(renewed, flag)| Done::Beat(renewed, flag)),
            Op::Report { worker, items, caller } => {
                self.report_in(w, *worker, items, caller).await?.map(Done::Reported)
            }
        })
    }

    /// Runs `group` in one write and answers each change; when the write fails, runs each change
    /// again in a write of its own.
    async fn commit_group(&self, group: Vec<Queued>) {
        // A lease whose caller gave up waiting (its deadline passed while the lease queued) is not
        // made: its tasks would sit leased to a worker that never learns of them until the lease
        // expires, and a task that loses three leases that way is recorded as lost. Reports and
        // heartbeats are applied all the same (a report is stored once, whoever waits for it).
        let (mut group, gone): (Vec<Queued>, Vec<Queued>) =
            group.into_iter().partition(|q| !(matches!(q.op, Op::Lease { .. }) && q.answer.is_closed()));
        if !gone.is_empty() {
            tracing::debug!(leases = gone.len(), "leases whose callers left were not made");
        }
        if group.is_empty() {
            return;
        }
        let together = async {
            let t0 = std::time::Instant::now();
            let weight: u32 = group.iter().map(|q| q.op.weight()).sum();
            // On PostgreSQL the write holds the jobs of the reported tasks (and those of what it
            // leases), not the whole database: other trackers' groups on other jobs go on beside
            // it. A report of a job another tracker's write holds is put back for a later group
            // (waited for once put back `MAX_PUT_BACK` times). A change that meets a job it does
            // not hold fails the group, which then runs each change alone in a write that holds
            // everything (below).
            let (mut try_, mut wait) = (Vec::new(), Vec::new());
            for q in &group {
                if let Op::Report { items, .. } = &q.op {
                    let into = if q.put_back >= MAX_PUT_BACK { &mut wait } else { &mut try_ };
                    into.extend(items.iter().map(|i| i.task));
                }
            }
            let (mut w, passed) = self.write_dispatch(&try_, &wait).await?;
            if !passed.is_empty() {
                let (later, now): (Vec<Queued>, Vec<Queued>) = std::mem::take(&mut group).into_iter().partition(
                    |q| matches!(&q.op, Op::Report { items, .. } if items.iter().any(|i| passed.contains(&i.task))),
                );
                tracing::debug!(reports = later.len(), "reports of jobs another tracker holds put back");
                self.commits.put_back(later);
                group = now;
            }
            let t1 = t0.elapsed();
            // The reports first, as one batch (`Tracker::reports_in`: a few statements for all of
            // them instead of a few for each call), then the other changes in arrival order. Any
            // order of a group's changes is one they could have run in: all of them were waiting
            // together, and none is answered before the commit. Leases after the reports also find
            // the tasks the reports' proposals made pending.
            let batches: Vec<_> = group
                .iter()
                .filter_map(|q| match &q.op {
                    Op::Report { worker, items, caller } => Some((*worker, items.as_slice(), caller)),
                    _ => None,
                })
                .collect();
            let mut reported = self.reports_in(&mut w, &batches).await?.into_iter();
            let mut done = Vec::with_capacity(group.len());
            for q in &group {
                done.push(match &q.op {
                    Op::Report { .. } => reported
                        .next()
                        .ok_or_else(|| Error::Internal("a report batch of a group had no answer".to_owned()))?
                        .map(Done::Reported),
                    op => self.apply(&mut w, op).await?,
                });
            }
            let t2 = t0.elapsed();
            w.commit(&self.events).await?;
            self.note_commit();
            let t3 = t0.elapsed();
            // Where the one writer's time goes, for load runs (`TENSORTUNE_LOAD_TRACKER_LOG=
            // "info,tensortune_tracker::commits=debug"`): taking the write lock, the changes'
            // statements, the commit (its sync to disk and any WAL checkpoint).
            tracing::debug!(
                changes = group.len(),
                weight,
                begin_us = micros(t1),
                apply_us = micros(t2 - t1),
                commit_us = micros(t3 - t2),
                "group committed"
            );
            Ok::<_, Error>(done)
        };
        match together.await {
            Ok(done) => {
                for (q, d) in group.into_iter().zip(done) {
                    let _ = q.answer.send(d);
                }
            }
            Err(e) if group.len() == 1 => {
                let q = group.into_iter().next().expect("a group of one");
                let _ = q.answer.send(Err(self.noting_outage(e)));
            }
            Err(e) => {
                tracing::debug!(error = %e, changes = group.len(), "a group commit failed; committing its changes one by one");
                for q in group {
                    let alone = async {
                        let mut w = self.write().await?;
                        let done = self.apply(&mut w, &q.op).await?;
                        w.commit(&self.events).await?;
                        self.note_commit();
                        Ok(done)
                    };
                    let answer = alone.await.unwrap_or_else(|e| Err(self.noting_outage(e)));
                    let _ = q.answer.send(answer);
                }
            }
        }
    }
}

/// The committer: runs the queued changes, as many to a write as `Commits::take` gives (in arrival
/// order, up to a group's weight), until `stop`; then closes the queue and runs what is left in it.
pub(crate) async fn committer(tracker: Arc<Tracker>, stop: CancellationToken) {
    loop {
        let group = tracker.commits.take(false);
        if group.is_empty() {
            tokio::select! {
                () = stop.cancelled() => break,
                () = tracker.commits.queued.notified() => continue,
            }
        }
        tracker.commit_group(group).await;
    }
    loop {
        let group = tracker.commits.take(true);
        if group.is_empty() {
            return;
        }
        tracker.commit_group(group).await;
    }
}

/// Whole microseconds of `d` (saturated), for the log.
fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
