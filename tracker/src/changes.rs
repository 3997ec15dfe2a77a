//! The changes the dispatch calls ask of a group commit (`commits`), what each did, and the queue
//! they wait in. Kept apart from the tracker and the dispatch code, which both need them, so that
//! neither has to import the other's module to name them.
//!
//! Also here: [`Renewals`], the lease renewals of heartbeats answered without a write, and
//! [`WorkerRows`], the workers' rows the dispatch calls check, kept between writes.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Instant;

use tokio::sync::{Notify, oneshot};

use crate::auth::Caller;
use crate::drift::FlagChange;
use crate::error::Result;
use crate::model::{RecordId, Reported, TaskId, WorkerId};
use crate::store::tasks::LeasedTask;
use crate::store::workers::WorkerRow;

/// Most changes one group takes: bounds a group's transaction (and the wait of the calls in it)
/// when calls arrive faster than they commit.
pub(crate) const MAX_GROUP: usize = 512;

/// Most work one group takes, in reported tasks (see [`Op::weight`]). A call waits for the group
/// in flight and then for its own, so this bounds a call's wait to about two groups' time instead
/// of two groups of [`MAX_GROUP`] calls of any size, while a group's one sync to disk (~3 ms on
/// the CI machine) stays a small part of it.
pub(crate) const GROUP_WEIGHT: u32 = 256;

/// Most tasks out for measurement that the queue lets leases add: a group takes leases only while
/// the reported tasks queued before it, plus the tasks its leases ask for, stay within this.
///
/// The load is a closed loop: every task leased comes back as a report, and whatever is in flight
/// waits at the slowest step, the writer. With leases served in arrival order the tasks in flight
/// (5,120 in the 1,000-worker run: 20 jobs x 256 outstanding) waited as reports in this queue, so
/// a report waited about in-flight / throughput (p99 1.8-2.7 s at ~2,000 tasks/s). Holding leases
/// while reports queue keeps the rest of them pending in the database instead, where they cost
/// nothing and no worker holds them (nor loses them when it dies), and lets a lease find a whole
/// batch instead of an empty queue. One group's weight: a report then waits for about the group
/// in flight, the reports queued before it (at most one group's) and its own group. Overridden by
/// `TENSORTUNE_LEASE_WINDOW` (tasks, >= 1) to compare windows in load runs.
pub(crate) const LEASE_WINDOW: u32 = GROUP_WEIGHT;

/// [`LEASE_WINDOW`], or `TENSORTUNE_LEASE_WINDOW` when set to a positive number (read once).
fn lease_window() -> u32 {
    static WINDOW: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *WINDOW.get_or_init(|| {
        std::env::var("TENSORTUNE_LEASE_WINDOW")
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .filter(|&n| n >= 1)
            .unwrap_or(LEASE_WINDOW)
    })
}

/// A change a dispatch call asks for.
pub(crate) enum Op {
    /// Lease up to `max` tasks to `worker`. `until` is the end of the call's wait: a lease still
    /// held by the lease window then is answered with no tasks instead of being made later.
    Lease { worker: WorkerId, max: u32, caller: Caller, until: Instant },
    /// Renew the leases `worker` holds among `tasks`, store its reference time.
    Heartbeat { worker: WorkerId, tasks: Vec<TaskId>, reference_us: Option<f64>, caller: Caller },
    /// Store a batch of reports of `worker`.
    Report { worker: WorkerId, items: Vec<ReportItem>, caller: Caller },
}

impl Op {
    /// Its work in reported tasks: a report counts its items; a lease a quarter of the tasks it
    /// asks for (one statement picks them all, one reads their details); a heartbeat one.
    pub(crate) fn weight(&self) -> u32 {
        match self {
            Op::Report { items, .. } => u32::try_from(items.len()).unwrap_or(u32::MAX).max(1),
            Op::Lease { max, .. } => max.div_ceil(4).max(1),
            Op::Heartbeat { .. } => 1,
        }
    }
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
pub(crate) struct Queued {
    pub(crate) op: Op,
    pub(crate) answer: oneshot::Sender<Result<Done>>,
    /// How many groups put it back because another tracker's write held one of its jobs
    /// (`commits`); from [`MAX_PUT_BACK`] on, its group waits for the jobs instead.
    pub(crate) put_back: u32,
}

/// How many times a report is put back for a later group while another tracker's write holds one
/// of its jobs (PostgreSQL) before its group waits for that write: passing over a held job keeps
/// both trackers' groups going, and the bound keeps a report of a job that another tracker
/// reports on all the time from waiting for ever.
pub(crate) const MAX_PUT_BACK: u32 = 2;

/// The queue of changes waiting for the committer.
#[derive(Default)]
pub(crate) struct Commits {
    queue: Mutex<Queue>,
    /// Wakes the committer.
    pub(crate) queued: Notify,
}

#[derive(Default)]
struct Queue {
    /// In arrival order. One queue for every kind: with reports served ahead of leases (tried on
    /// 2026-11-28), leases waited behind them past their callers' deadlines and workers idled
    /// (lease p50 9.4 s at 1,000 workers); first come, first served keeps both moving. Leases
    /// are held only while the queued reports fill the lease window ([`LEASE_WINDOW`]), which
    /// one or two groups drain.
    ops: VecDeque<Queued>,
    /// The reported tasks among `ops` (the sum of their reports' weights).
    reports: u32,
    /// Set when the committer stopped: later changes are refused as unavailable.
    closed: bool,
}

impl Commits {
    pub(crate) fn push(&self, q: Queued) -> std::result::Result<(), Queued> {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if queue.closed {
            return Err(q);
        }
        if let Op::Report { .. } = q.op {
            queue.reports = queue.reports.saturating_add(q.op.weight());
        }
        queue.ops.push_back(q);
        drop(queue);
        self.queued.notify_one();
        Ok(())
    }

    /// Puts `ops` back at the head of the queue, in their order, for the next group; each counts
    /// one more put-back.
    pub(crate) fn put_back(&self, ops: Vec<Queued>) {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        for mut q in ops.into_iter().rev() {
            q.put_back += 1;
            if let Op::Report { .. } = q.op {
                queue.reports = queue.reports.saturating_add(q.op.weight());
            }
            queue.ops.push_front(q);
        }
        drop(queue);
        self.queued.notify_one();
    }

    /// The next group, in arrival order, up to [`GROUP_WEIGHT`] of work and [`MAX_GROUP`]
    /// changes; at least one change when any is queued. `close` refuses later changes.
    ///
    /// Leases are held (left in the queue, in their order, for a later group) once the reported
    /// tasks queued at the start plus the tasks of the leases taken reach the lease window
    /// ([`LEASE_WINDOW`]); the reports and heartbeats behind them go on. A group with no reports
    /// queued always takes leases.
    ///
    /// A held lease whose wait ended (`until`) is answered with no tasks and leaves the queue: its
    /// caller's own deadline comes soon after, and a lease made after the caller gave up leaves
    /// its tasks leased to a worker that never learns of them until the lease expires (on a
    /// loaded PostgreSQL tracker, where a group takes seconds, 1,009 leases expired that way in a
    /// run before this rule, against 19 without the window).
    pub(crate) fn take(&self, close: bool) -> Vec<Queued> {
        self.take_within(close, lease_window(), Instant::now())
    }

    fn take_within(&self, close: bool, window: u32, now: Instant) -> Vec<Queued> {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        queue.closed |= close;
        let mut room = window.saturating_sub(queue.reports);
        let mut group = Vec::new();
        let mut weight = 0;
        let mut at = 0;
        while let Some(next) = queue.ops.get(at) {
            if room == 0
                && let Op::Lease { until, .. } = next.op
            {
                // Held: the tasks it would take out would wait here as reports.
                if until <= now
                    && let Some(late) = queue.ops.remove(at)
                {
                    let _ = late.answer.send(Ok(Done::Leased(Vec::new())));
                } else {
                    at += 1;
                }
                continue;
            }
            let w = next.op.weight();
            if group.len() >= MAX_GROUP || (!group.is_empty() && weight + w > GROUP_WEIGHT) {
                break;
            }
            match next.op {
                Op::Lease { max, .. } => room = room.saturating_sub(max.max(1)),
                Op::Report { .. } => queue.reports = queue.reports.saturating_sub(w),
                Op::Heartbeat { .. } => {}
            }
            weight += w;
            group.extend(queue.ops.remove(at));
        }
        group
    }
}

/// What became of a report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Report {
    /// False when the task already had a record: the report was acknowledged and dropped.
    pub(crate) stored: bool,
    /// The task's record (the earlier one when not stored).
    pub(crate) record_id: Option<RecordId>,
    /// Whether some measurement of a stored report is not trusted.
    pub(crate) untrusted: bool,
}

/// One report of a batch (`Tracker::report_batch`): the task, the lease it answers, and what
/// was measured (or why the report was refused on arrival, as malformed).
pub(crate) struct ReportItem {
    pub(crate) task: TaskId,
    pub(crate) lease_serial: u32,
    pub(crate) reported: Result<Reported>,
}

/// Lease renewals that heartbeats made without a write, and the times leases and reports last
/// heard from each worker, waiting for the reaper to store them.
///
/// A heartbeat only extends leases and marks its worker seen. Queued behind a group of reports it
/// waited as long as the group took (up to 16 s at p99 on the loaded CI machine, longer than a
/// short lease), so leases of live workers expired. Now it reads which of its tasks the worker
/// holds (a read, beside the writer), notes the renewal here and answers at once. The one who acts
/// on lease deadlines, the reaper, stores every noted renewal in its write before it looks for
/// expired leases, so no lease renewed here is expired. A tracker that dies loses the renewals
/// noted since its last reap: the next tracker gives every lease a whole lease at start anyway,
/// and on a shared PostgreSQL store the reaper runs every quarter lease, so another tracker sees
/// a renewal long before the lease it extends ends.
#[derive(Default)]
pub(crate) struct Renewals {
    pending: Mutex<HashMap<WorkerId, Renewal>>,
}

/// The noted renewals of one worker.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Renewal {
    /// When it was last heard from.
    pub(crate) seen_ms: i64,
    /// Until when its leases among `tasks` run (the latest heartbeat's deadline).
    pub(crate) expires_ms: i64,
    /// The tasks its heartbeats found it holding.
    pub(crate) tasks: HashSet<TaskId>,
}

impl Renewals {
    /// Notes that `worker` was heard from at `seen_ms` and holds `tasks` until `expires_ms`.
    pub(crate) fn note(&self, worker: WorkerId, tasks: &[TaskId], seen_ms: i64, expires_ms: i64) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let r = pending.entry(worker).or_default();
        r.seen_ms = r.seen_ms.max(seen_ms);
        r.expires_ms = r.expires_ms.max(expires_ms);
        r.tasks.extend(tasks.iter().copied());
    }

    /// Notes that `worker` was heard from at `seen_ms` (a lease or a report: its row is marked seen
    /// by the reaper's next write instead of by a statement in each group that holds its call).
    pub(crate) fn seen(&self, worker: WorkerId, seen_ms: i64) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let r = pending.entry(worker).or_default();
        r.seen_ms = r.seen_ms.max(seen_ms);
    }

    /// Takes every noted renewal, to store.
    pub(crate) fn take(&self) -> HashMap<WorkerId, Renewal> {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Puts back renewals taken for a write that failed, merged with those noted since.
    pub(crate) fn restore(&self, taken: HashMap<WorkerId, Renewal>) {
        for (worker, r) in taken {
            let tasks: Vec<TaskId> = r.tasks.into_iter().collect();
            self.note(worker, &tasks, r.seen_ms, r.expires_ms);
        }
    }
}

/// Workers' rows as last read, for the checks of dispatch calls (token, quarantine, class,
/// templates, reference time), so that a lease, a report or a heartbeat does not read its
/// worker's row each time: at 1,000 workers that read was one in ten of the tracker's statements.
///
/// Only on SQLite, where this tracker is the only writer: on PostgreSQL another tracker may
/// quarantine a worker, and its rows are always read. A write that changes a worker's row (a
/// registration, a quarantine, a new reference time) drops every kept row when it ends, committed
/// or not ([`WorkerRows::changed`]); a row read before such a change and kept after it would be
/// stale, so a row is kept only when no change ended between its read and [`WorkerRows::keep`]
/// (the generation taken before the read says so).
#[derive(Default)]
pub(crate) struct WorkerRows {
    rows: Mutex<(u64, HashMap<WorkerId, WorkerRow>)>,
}

impl WorkerRows {
    /// The generation to pass to [`WorkerRows::keep`]: take it before reading a row.
    pub(crate) fn generation(&self) -> u64 {
        self.rows.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    /// Worker `id`'s kept row.
    pub(crate) fn get(&self, id: WorkerId) -> Option<WorkerRow> {
        self.rows.lock().unwrap_or_else(|e| e.into_inner()).1.get(&id).cloned()
    }

    /// Keeps `row`, read after [`WorkerRows::generation`] gave `generation`, unless a change of
    /// workers ended since.
    pub(crate) fn keep(&self, generation: u64, row: &WorkerRow) {
        let mut rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        if rows.0 == generation {
            rows.1.insert(row.id, row.clone());
        }
    }

    /// Drops every kept row: a write that changed a worker's row ended.
    pub(crate) fn changed(&self) {
        let mut rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        rows.0 += 1;
        rows.1.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    fn queued(op: Op) -> (Queued, oneshot::Receiver<Result<Done>>) {
        let (answer, rx) = oneshot::channel();
        (Queued { op, answer, put_back: 0 }, rx)
    }

    fn report(worker: WorkerId, n: usize) -> Op {
        let items = (0..n)
            .map(|i| ReportItem { task: i as TaskId, lease_serial: 1, reported: Err(Error::TaskNotFound(0)) })
            .collect();
        Op::Report { worker, items, caller: Caller::OPEN }
    }

    fn lease(worker: WorkerId, max: u32) -> Op {
        Op::Lease { worker, max, caller: Caller::OPEN, until: Instant::now() + std::time::Duration::from_secs(60) }
    }

    fn kinds(group: &[Queued]) -> Vec<(char, WorkerId)> {
        group
            .iter()
            .map(|q| match &q.op {
                Op::Report { worker, .. } => ('r', *worker),
                Op::Lease { worker, .. } => ('l', *worker),
                Op::Heartbeat { worker, .. } => ('h', *worker),
            })
            .collect()
    }

    #[test]
    fn a_group_takes_changes_in_arrival_order_up_to_its_weight() {
        let commits = Commits::default();
        let mut answers = Vec::new();
        for op in [lease(1, 16), report(2, 100), report(3, 100), report(4, 100), lease(5, 16)] {
            let (q, rx) = queued(op);
            answers.push(rx);
            assert!(commits.push(q).is_ok());
        }
        // 4 + 100 + 100 fit in 256; the third report would not. (No lease window here.)
        let take = |close| commits.take_within(close, u32::MAX, Instant::now());
        assert_eq!(kinds(&take(false)), [('l', 1), ('r', 2), ('r', 3)]);
        assert_eq!(kinds(&take(false)), [('r', 4), ('l', 5)]);
        assert!(take(false).is_empty());
        // One change heavier than a whole group still goes, alone.
        let (q, _rx) = queued(report(6, 1000));
        assert!(commits.push(q).is_ok());
        let (q, _rx2) = queued(report(7, 1));
        assert!(commits.push(q).is_ok());
        assert_eq!(kinds(&take(true)), [('r', 6)]);
        let (q, _rx3) = queued(report(8, 1));
        assert!(commits.push(q).is_err(), "a closed queue refuses changes");
        assert_eq!(kinds(&take(true)), [('r', 7)], "what was queued before closing is still taken");
    }

    #[test]
    fn reports_put_back_go_first_in_the_next_group_and_count_in_the_lease_window() {
        let commits = Commits::default();
        let mut answers = Vec::new();
        for op in [report(1, 100), report(2, 50), lease(3, 16)] {
            let (q, rx) = queued(op);
            answers.push(rx);
            assert!(commits.push(q).is_ok());
        }
        let mut group = commits.take_within(false, u32::MAX, Instant::now());
        assert_eq!(kinds(&group), [('r', 1), ('r', 2), ('l', 3)]);
        // Both reports put back (their jobs held elsewhere), in their order, ahead of what came since.
        let (q, _rx) = queued(report(4, 10));
        assert!(commits.push(q).is_ok());
        let leased = group.pop().expect("the lease");
        assert!(matches!(leased.op, Op::Lease { .. }));
        commits.put_back(group);
        // 160 reported tasks queued again: a lease of 16 fits a window of 176, a second does not.
        for op in [lease(5, 16), lease(6, 16)] {
            let (q, rx) = queued(op);
            answers.push(rx);
            assert!(commits.push(q).is_ok());
        }
        let again = commits.take_within(false, 176, Instant::now());
        assert_eq!(kinds(&again), [('r', 1), ('r', 2), ('r', 4), ('l', 5)]);
        assert_eq!(again.iter().map(|q| q.put_back).collect::<Vec<_>>(), [1, 1, 0, 0]);
        commits.put_back(again.into_iter().take(1).collect());
        let last = commits.take_within(false, u32::MAX, Instant::now());
        assert_eq!(kinds(&last), [('r', 1), ('l', 6)]);
        assert_eq!(last[0].put_back, 2, "each put-back counts");
    }

    #[test]
    fn leases_wait_while_queued_reports_fill_the_lease_window() {
        let commits = Commits::default();
        let mut answers = Vec::new();
        let mut push = |op| {
            let (q, rx) = queued(op);
            answers.push(rx);
            assert!(commits.push(q).is_ok());
        };
        for op in [report(1, 200), lease(2, 16), report(3, 40), lease(4, 16), lease(5, 16)] {
            push(op);
        }
        // 240 reported tasks queued leave room for 16 leased ones in a window of 256: lease 2
        // goes, 4 and 5 wait (though their weight would fit the group).
        assert_eq!(kinds(&commits.take_within(false, 256, Instant::now())), [('r', 1), ('l', 2), ('r', 3)]);
        // No reports queued: leases go, in their order.
        assert_eq!(kinds(&commits.take_within(false, 256, Instant::now())), [('l', 4), ('l', 5)]);
        // Reports beyond the window: the lease waits, the report behind it does not.
        for op in [report(6, 250), lease(7, 16), report(8, 6)] {
            push(op);
        }
        assert_eq!(kinds(&commits.take_within(false, 256, Instant::now())), [('r', 6), ('r', 8)]);
        assert_eq!(kinds(&commits.take_within(false, 256, Instant::now())), [('l', 7)]);
        // Closing takes everything, held leases last.
        for op in [report(9, 300), lease(10, 16)] {
            push(op);
        }
        assert_eq!(kinds(&commits.take_within(true, 256, Instant::now())), [('r', 9)]);
        assert_eq!(kinds(&commits.take_within(true, 256, Instant::now())), [('l', 10)]);
        assert!(commits.take_within(true, 256, Instant::now()).is_empty());
    }

    #[test]
    fn a_held_lease_whose_wait_ended_is_answered_empty_and_leaves_the_queue() {
        let commits = Commits::default();
        let (q, _r1) = queued(report(1, 300));
        assert!(commits.push(q).is_ok());
        let (q, mut held) = queued(lease(2, 16));
        assert!(commits.push(q).is_ok());
        let (q, _r3) = queued(report(3, 10));
        assert!(commits.push(q).is_ok());
        let later = Instant::now() + std::time::Duration::from_secs(61);
        assert_eq!(kinds(&commits.take_within(false, 256, later)), [('r', 1)]);
        match held.try_recv() {
            Ok(Ok(Done::Leased(tasks))) => assert!(tasks.is_empty()),
            _ => panic!("the late lease should have been answered with no tasks"),
        }
        assert_eq!(kinds(&commits.take_within(false, 256, later)), [('r', 3)], "and is not taken later");
        assert!(commits.take_within(false, 256, later).is_empty());
    }

    #[test]
    fn renewals_of_a_worker_merge_to_the_latest_deadline_and_every_task() {
        let r = Renewals::default();
        r.note(7, &[1, 2], 1_000, 31_000);
        r.note(7, &[2, 3], 2_000, 32_000);
        r.note(8, &[], 1_500, 31_500);
        let taken = r.take();
        assert_eq!(taken[&7].tasks, HashSet::from([1, 2, 3]));
        assert_eq!((taken[&7].seen_ms, taken[&7].expires_ms), (2_000, 32_000));
        assert!(taken[&8].tasks.is_empty());
        assert!(r.take().is_empty(), "taken renewals are gone");
        r.note(7, &[4], 3_000, 33_000);
        r.restore(taken);
        let again = r.take();
        assert_eq!(again[&7].tasks, HashSet::from([1, 2, 3, 4]));
        assert_eq!(again[&7].expires_ms, 33_000, "a restored renewal never shortens a later one");
        assert_eq!(again.len(), 2);
    }
}
