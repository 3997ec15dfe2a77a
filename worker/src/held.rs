//! The tasks a worker holds, from lease to report: each holds one permit of the room semaphore
//! (back-pressure), is listed in heartbeats (lease renewal), and carries a token the heartbeat
//! cancels when the tracker drops the task. Dropping a [`Lease`] releases all three.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

/// Held task ids, each with the serial of its lease and its drop token.
#[derive(Default)]
pub(crate) struct Held {
    tasks: Mutex<HashMap<u64, (u64, CancellationToken)>>,
    /// Tells leases of the same task id apart, so a late drop of an old lease cannot remove a
    /// new one.
    serial: AtomicU64,
}

impl Held {
    /// Holds `task_id` with `permit`; `None` when it is held already (the tracker leased it twice).
    pub(crate) fn hold(
        self: &Arc<Self>,
        task_id: u64,
        lease_serial: u32,
        permit: OwnedSemaphorePermit,
    ) -> Option<Lease> {
        let mut tasks = self.tasks.lock().expect("held tasks lock");
        if tasks.contains_key(&task_id) {
            return None;
        }
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        let dropped = CancellationToken::new();
        tasks.insert(task_id, (serial, dropped.clone()));
        Some(Lease { task_id, lease_serial, serial, dropped, held: self.clone(), _permit: permit })
    }

    /// Held task ids, sorted.
    pub(crate) fn ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.tasks.lock().expect("held tasks lock").keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// How many tasks are held: leased and not yet reported (or dropped).
    pub(crate) fn len(&self) -> usize {
        self.tasks.lock().expect("held tasks lock").len()
    }

    /// Stops holding `task_id` and tells its stages to abandon it; false when it was not held.
    pub(crate) fn drop_task(&self, task_id: u64) -> bool {
        match self.tasks.lock().expect("held tasks lock").remove(&task_id) {
            Some((_, token)) => {
                token.cancel();
                true
            }
            None => false,
        }
    }
}

/// One held task. Travels with the task through the stages.
pub(crate) struct Lease {
    /// The tracker's task id.
    pub(crate) task_id: u64,
    /// Which lease of the task the tracker gave (its report names it).
    pub(crate) lease_serial: u32,
    serial: u64,
    /// Cancelled when the tracker drops the task: stages abandon it and nothing is reported.
    pub(crate) dropped: CancellationToken,
    held: Arc<Held>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut tasks = self.held.tasks.lock().expect("held tasks lock");
        if tasks.get(&self.task_id).is_some_and(|(serial, _)| *serial == self.serial) {
            tasks.remove(&self.task_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::Semaphore;

    #[test]
    fn leases_hold_permits_and_ids_until_dropped() {
        let room = Arc::new(Semaphore::new(2));
        let held = Arc::new(Held::default());
        let a = held.hold(7, 1, room.clone().try_acquire_owned().unwrap()).unwrap();
        let b = held.hold(3, 1, room.clone().try_acquire_owned().unwrap()).unwrap();
        assert_eq!(held.ids(), vec![3, 7]);
        assert_eq!(room.available_permits(), 0);

        assert!(held.drop_task(7) && a.dropped.is_cancelled() && !b.dropped.is_cancelled());
        assert!(!held.drop_task(7));
        assert_eq!(held.ids(), vec![3]);
        drop(a);
        assert_eq!(room.available_permits(), 1);

        let dup = held.hold(3, 1, room.clone().try_acquire_owned().unwrap());
        assert!(dup.is_none(), "a task held twice is refused");
        assert_eq!(room.available_permits(), 1, "the refused lease's permit comes back");
        drop(b);
        assert!(held.ids().is_empty());
        assert_eq!(room.available_permits(), 2);
    }
}
