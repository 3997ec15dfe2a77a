//! Group commit of the dispatch calls: leases, heartbeats and reports of many workers share one
//! write (one transaction, one commit) instead of one each.
//!
//! A commit costs the database a sync to disk (about 3 ms on the CI machine's disk), and writes
//! are one at a time: with one transaction per call a tracker stores at most a few hundred calls a
//! second, however little each does. Here a call queues its change ([`Op`]) and waits; the
//! committer task takes every queued change at once and runs them in one [`Write`], so the syncs
//! per second stay the same while the calls per sync grow with the load.
//!
//! Each change first checks what it can refuse (an unknown or quarantined worker, a stale report)
//! and answers such a refusal on its own, without writing. A failure after that (the database)
//! would fail every change of the group; the group is then rolled back and each change run again
//! alone, so that one change's failure fails only its own call.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;

use crate::auth::Caller;
use crate::dispatch::{Report, ReportItem};
use crate::drift::FlagChange;
use crate::error::{Error, Result};
use crate::model::{TaskId, WorkerId};
use crate::store::tasks::LeasedTask;
use crate::tracker::{Tracker, Write};

/// Most changes one group takes: bounds a group's transaction (and the wait of the calls in it)
/// when calls arrive faster than they commit.
const MAX_GROUP: usize = 512;

/// A change a dispatch call asks for.
pub(crate) enum Op {
    /// Lease up to `max` tasks to `worker`.
    Lease { worker: WorkerId, max: u32, caller: Caller },
    /// Renew the leases `worker` holds among `tasks`, store its reference time.
    Heartbeat { worker: WorkerId, tasks: Vec<TaskId>, reference_us: Option<f64>, caller: Caller },
    /// Store a batch of reports of `worker`.
    Report { worker: WorkerId, items: Vec<ReportItem>, caller: Caller },
}

/// What a change did.
pub(crate) enum Done {
    /// The tasks leased.
    Leased(Vec<LeasedTask>),
    /// The leases renewed, and the worker's drift flag if it changed.
    Beat(HashSet<TaskId>, Option<FlagChange>),
    /// Each report's outcome, in the batch's order.
    Reported(Vec<Result<Report>>),
}

/// A queued change and where its answer goes.
struct Queued {
    op: Op,
    answer: oneshot::Sender<Result<Done>>,
}

/// The queue of changes waiting for the committer.
#[derive(Default)]
pub(crate) struct Commits {
    queue: Mutex<Queue>,
    /// Wakes the committer.
    queued: Notify,
}

#[derive(Default)]
struct Queue {
    ops: Vec<Queued>,
    /// Set when the committer stopped: later changes are refused as unavailable.
    closed: bool,
}

impl Commits {
    fn push(&self, q: Queued) -> std::result::Result<(), Queued> {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if queue.closed {
            return Err(q);
        }
        queue.ops.push(q);
        drop(queue);
        self.queued.notify_one();
        Ok(())
    }

    fn take(&self, close: bool) -> Vec<Queued> {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        queue.closed |= close;
        let n = queue.ops.len().min(MAX_GROUP);
        queue.ops.drain(..n).collect()
    }
}

impl Tracker {
    /// Runs `op` in the next group commit; returns what it did once its group committed.
    pub(crate) async fn commit_op(&self, op: Op) -> Result<Done> {
        let (answer, done) = oneshot::channel();
        if self.commits.push(Queued { op, answer }).is_err() {
            return Err(Error::Unavailable("the tracker is shutting down; retry".to_owned()));
        }
        // The committer answers every change it takes, and takes every queued one before it stops.
        done.await.unwrap_or_else(|_| Err(Error::Unavailable("the tracker is shutting down; retry".to_owned())))
    }

    /// Runs `op` inside `w`. The outer error fails the whole group (the database); the inner one
    /// refuses this change alone, which then wrote nothing.
    async fn apply(&self, w: &mut Write<'_>, op: &Op) -> Result<Result<Done>> {
        Ok(match op {
            Op::Lease { worker, max, caller } => self.lease_in(w, *worker, *max, caller).await?.map(Done::Leased),
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
        let together = async {
            let mut w = self.write().await?;
            let mut done = Vec::with_capacity(group.len());
            for q in &group {
                done.push(self.apply(&mut w, &q.op).await?);
            }
            w.commit(&self.events).await?;
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
                        Ok(done)
                    };
                    let answer = alone.await.unwrap_or_else(|e| Err(self.noting_outage(e)));
                    let _ = q.answer.send(answer);
                }
            }
        }
    }
}

/// The committer: runs the queued changes, as many to a write as are queued (up to
/// [`MAX_GROUP`]), until `stop`; then closes the queue and runs what is left in it.
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
