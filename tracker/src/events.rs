//! Notifications from the write paths to the waiting readers: job watchers and long-polling
//! `LeaseTasks` calls. Nothing here is state; a reader that misses a notification re-reads the
//! database.

use tokio::sync::futures::Notified;
use tokio::sync::{Notify, broadcast};

use crate::model::JobId;

/// Job changes a watcher may fall behind by before it is told it lagged (it then re-reads the job,
/// which is all a notification would have made it do).
const JOB_EVENTS: usize = 1024;

/// Tasks made pending per waiting `LeaseTasks` call woken: the load tool's workers lease 16 at a
/// time and the worker daemon at least its compile threads (often more), so a wake per 16 tasks
/// rarely wakes too few; one that does is made up for by [`Events::pass_on`].
const TASKS_PER_WAKE: u32 = 16;

/// The tracker's notifications.
pub(crate) struct Events {
    jobs: broadcast::Sender<JobId>,
    tasks: Notify,
}

impl Events {
    /// Notifications with no listener yet.
    pub(crate) fn new() -> Events {
        Events { jobs: broadcast::channel(JOB_EVENTS).0, tasks: Notify::new() }
    }

    /// Announces that job `id` changed (state, progress or best).
    pub(crate) fn job_changed(&self, id: JobId) {
        // An error only means that nobody is watching.
        let _ = self.jobs.send(id);
    }

    /// Job changes from now on.
    pub(crate) fn watch_jobs(&self) -> broadcast::Receiver<JobId> {
        self.jobs.subscribe()
    }

    /// Tasks became pending: `Some(n)` wakes about one waiting `LeaseTasks` call per
    /// [`TASKS_PER_WAKE`] of the `n` (at least one), `None` (how many is not known: another
    /// tracker's) every one.
    ///
    /// Waking every waiter for every change was a herd: at 1,000 workers with most of them idle,
    /// each commit that proposed a few tasks woke hundreds of lease calls, each of which queued a
    /// write that found nothing (2026-11-28: 35,138 lease statements for 10,000 tasks, 695 of them
    /// leasing anything; docs/tracker-scaling.md). A woken call that leases all it asked for wakes
    /// the next ([`Events::pass_on`]), so no pending task waits for a long poll to end while
    /// callers wait, whatever the callers ask for.
    pub(crate) fn tasks_ready(&self, n: Option<u32>) {
        match n {
            None => self.tasks.notify_waiters(),
            Some(n) => {
                for _ in 0..n.div_ceil(TASKS_PER_WAKE).max(1) {
                    self.tasks.notify_one();
                }
            }
        }
    }

    /// Wakes one more waiting `LeaseTasks` call: the caller leased all it asked for (more tasks
    /// may be pending), or failed after it was woken (its wake must not be lost).
    pub(crate) fn pass_on(&self) {
        self.tasks.notify_one();
    }

    /// Resolves when [`Events::tasks_ready`] or [`Events::pass_on`] wakes this caller; call `enable`
    /// on it before looking for work so that a notification between the look and the wait is not
    /// lost. Dropped after it was woken (its call returned meanwhile), it hands the wake to the
    /// next waiter (tokio's `Notify` does).
    pub(crate) fn next_tasks(&self) -> Notified<'_> {
        self.tasks.notified()
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Waker};

    use super::*;

    /// How many of `waiters` a poll finds woken; those are removed.
    fn woken(waiters: &mut Vec<Pin<Box<Notified<'_>>>>) -> usize {
        let before = waiters.len();
        let mut cx = Context::from_waker(Waker::noop());
        waiters.retain_mut(|w| w.as_mut().poll(&mut cx).is_pending());
        before - waiters.len()
    }

    #[test]
    fn tasks_wake_one_waiter_per_sixteen_and_unknown_counts_wake_all() {
        let events = Events::new();
        let mut waiters: Vec<_> = (0..6).map(|_| Box::pin(events.next_tasks())).collect();
        for w in &mut waiters {
            w.as_mut().enable();
        }
        events.tasks_ready(Some(17));
        assert_eq!(woken(&mut waiters), 2, "17 tasks wake two waiters");
        events.tasks_ready(Some(1));
        assert_eq!(woken(&mut waiters), 1, "one task wakes one");
        events.pass_on();
        assert_eq!(woken(&mut waiters), 1, "a full lease wakes the next");
        events.tasks_ready(None);
        assert_eq!(woken(&mut waiters), 2, "an unknown count wakes every waiter");
    }
}
