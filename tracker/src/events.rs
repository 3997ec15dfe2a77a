//! Notifications from the write paths to the waiting readers: job watchers and long-polling
//! `LeaseTasks` calls. Nothing here is state; a reader that misses a notification re-reads the
//! database.

use tokio::sync::futures::Notified;
use tokio::sync::{Notify, broadcast};

use crate::model::JobId;

/// Job changes a watcher may fall behind by before it is told it lagged (it then re-reads the job,
/// which is all a notification would have made it do).
const JOB_EVENTS: usize = 1024;

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

    /// Wakes every `LeaseTasks` call waiting for work: tasks became pending.
    pub(crate) fn tasks_ready(&self) {
        self.tasks.notify_waiters();
    }

    /// Resolves at the next [`Events::tasks_ready`]; call `enable` on it before looking for work so
    /// that a notification between the look and the wait is not lost.
    pub(crate) fn next_tasks(&self) -> Notified<'_> {
        self.tasks.notified()
    }
}
