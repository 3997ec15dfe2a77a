//! The tracker's shared state and its unit of change, [`Write`].
//!
//! Every change goes through one `Write`: the writer lock, a SQLite transaction, and the in-memory
//! searches kept in step with the tasks table. What a write proposes, and the outcomes of the trials
//! it finishes, are merged into the searches only once its transaction committed (its own
//! proposals see them before); a write that fails or is dropped half-way (its client went
//! away) makes the searches it touched reload from the database instead, so memory never runs
//! ahead of the source of truth.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{Mutex, MutexGuard};
use tokio_util::sync::CancellationToken;

use crate::auth::Tokens;
use crate::config::TrackerConfig;
use crate::counters::Counters;
use crate::error::Result;
use crate::events::Events;
use crate::model::{JobId, now_ms};
use crate::search::{AheadWork, PriorKey, Search, SearchKey, Searches};
use crate::store::{Exec, Pool, Tx};
use crate::tuner::{Observed, Point};
use tensortune_search::tuner::Prior;

/// State shared by the services and the background tasks.
pub(crate) struct Tracker {
    pub(crate) pool: Pool,
    pub(crate) config: TrackerConfig,
    pub(crate) events: Events,
    /// The tokens the services' interceptors check calls against.
    pub(crate) tokens: Arc<Tokens>,
    /// What happened since start, for `/metrics`.
    pub(crate) counters: Counters,
    /// Ends long polls and streams so that a graceful shutdown does not wait for them.
    pub(crate) shutdown: CancellationToken,
    /// Set when a write failed because the database could not be written (full, read-only,
    /// i/o error): heartbeats failed meanwhile, so the reaper renews every lease once writes go
    /// through again instead of expiring the leases of workers that are alive.
    pub(crate) outage: AtomicBool,
    /// Dispatch changes waiting for the committer (`commits`), many to a write.
    pub(crate) commits: crate::changes::Commits,
    /// Lease renewals of heartbeats answered without a write, stored by the reaper.
    pub(crate) renewals: crate::changes::Renewals,
    /// Workers' rows kept between writes for the dispatch calls' checks (SQLite only).
    pub(crate) worker_rows: crate::changes::WorkerRows,
    /// When the committer last committed a group: readiness takes a recent commit as proof that
    /// the database can be written (`health::ready`), since a busy committer holds the write lock
    /// nearly all the time and a probe waiting for it would time out on a tracker that works.
    pub(crate) last_commit: std::sync::Mutex<Option<std::time::Instant>>,
    /// The writer lock. SQLite admits one writer at a time anyway; taking it here first makes each
    /// read-decide-write sequence (lease, report, propose) atomic together with the searches it
    /// guards, and spares writers SQLite's busy-wait.
    searches: Mutex<Searches>,
    /// A random number naming this tracker process in its PostgreSQL notifications, so that it
    /// skips its own (it has woken its waiters already).
    pub(crate) instance: u64,
    /// Proposals to make off the writer lock ([`Write::propose`]), for [`proposer`].
    ahead: tokio::sync::mpsc::UnboundedSender<(SearchKey, AheadWork)>,
    /// Its receiving end, until [`proposer`] takes it.
    ahead_rx: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<(SearchKey, AheadWork)>>>,
}

impl Tracker {
    /// A tracker over an opened, migrated database.
    pub(crate) fn new(pool: Pool, config: TrackerConfig, shutdown: CancellationToken) -> Arc<Tracker> {
        let (ahead, ahead_rx) = tokio::sync::mpsc::unbounded_channel();
        Arc::new(Tracker {
            ahead,
            ahead_rx: std::sync::Mutex::new(Some(ahead_rx)),
            pool,
            config,
            events: Events::new(),
            tokens: Arc::new(Tokens::default()),
            counters: Counters::default(),
            shutdown,
            outage: AtomicBool::new(false),
            commits: crate::changes::Commits::default(),
            renewals: crate::changes::Renewals::default(),
            worker_rows: crate::changes::WorkerRows::default(),
            last_commit: std::sync::Mutex::new(None),
            searches: Mutex::new(Searches::default()),
            instance: rand::random(),
        })
    }

    /// Starts a write holding the whole database.
    pub(crate) async fn write(&self) -> Result<Write<'_>> {
        let searches = self.searches.lock().await;
        // The database's write lock is taken now rather than at the first write (see
        // `Pool::begin_write`).
        let tx = self.pool.begin_write().await?;
        self.begin(searches, tx, None).await
    }

    /// Starts the write of a dispatch group (`commits`) whose reports name the tasks `try_` and
    /// `wait`. On PostgreSQL it holds jobs, not the whole database (`Pool::begin_dispatch`): those
    /// of `wait`'s tasks, waited for; those of `try_`'s that no other tracker's write holds; later
    /// those of the tasks it leases. Another tracker's group on other jobs runs beside it. Returns
    /// the tasks among `try_` whose job it does not hold (their reports wait for a later group).
    /// On SQLite it is [`Tracker::write`], holding everything.
    pub(crate) async fn write_dispatch(
        &self,
        try_: &[crate::model::TaskId],
        wait: &[crate::model::TaskId],
    ) -> Result<(Write<'_>, HashSet<crate::model::TaskId>)> {
        if !self.pool.is_postgres() {
            return Ok((self.write().await?, HashSet::new()));
        }
        let searches = self.searches.lock().await;
        let mut tx = self.pool.begin_dispatch().await?;
        // Before anything is read: what is read from here on is what the jobs' last writers left.
        let mut held = HashSet::new();
        let mut passed = HashSet::new();
        for (task, job, got) in crate::store::tasks::lock_jobs_of(&mut tx, try_, wait).await? {
            if got {
                held.insert(job);
            } else {
                passed.insert(task);
            }
        }
        Ok((self.begin(searches, tx, Some(held)).await?, passed))
    }

    /// A write on `tx`, holding the jobs `held` (`None`: the whole database).
    async fn begin<'a>(
        &'a self,
        mut searches: MutexGuard<'a, Searches>,
        mut tx: Tx,
        held: Option<HashSet<JobId>>,
    ) -> Result<Write<'a>> {
        let versions = if self.pool.is_postgres() {
            // Other trackers may have proposed or finished tasks since this one last wrote: a
            // search mirroring an older version of its workload is reloaded when next needed.
            // Read once the jobs are held: the versions of a job another tracker's write holds
            // may still move, but this write uses no search of a job it does not hold.
            let current: HashMap<SearchKey, i64> = crate::store::workloads::versions(&mut tx)
                .await?
                .into_iter()
                .map(|(job, idx, v)| ((job, idx), v))
                .collect();
            searches.keep_current(&current);
            Some(current)
        } else {
            None
        };
        Ok(Write {
            ahead: &self.ahead,
            tx: Some(tx),
            held,
            instance: self.instance,
            versions,
            searches,
            now: now_ms(),
            touched: HashSet::new(),
            proposed: HashMap::new(),
            observed: HashMap::new(),
            priors: Vec::new(),
            stopped: Vec::new(),
            changed: BTreeSet::new(),
            tasks_ready: 0,
            leased: 0,
            workers: HashMap::new(),
            workload_rows: HashMap::new(),
            unsaved: BTreeSet::new(),
            jobs_touched: HashSet::new(),
            outstanding: HashMap::new(),
            jobs: HashMap::new(),
            worker_rows: &self.worker_rows,
            workers_changed: false,
            finished: false,
        })
    }

    /// Notes an outage of the database when `e` is one; returns `e`.
    pub(crate) fn noting_outage(&self, e: crate::error::Error) -> crate::error::Error {
        if e.unwritable() {
            self.outage.store(true, Ordering::Release);
        }
        e
    }

    /// Worker `id`'s row for a dispatch call's checks (its counts read 0: `store::workers::get_lean`),
    /// read through `e` unless kept from an earlier read (`changes::WorkerRows`, SQLite only).
    pub(crate) async fn worker_row(
        &self,
        e: impl Into<Exec<'_>>,
        id: crate::model::WorkerId,
    ) -> Result<Option<crate::store::workers::WorkerRow>> {
        let keep = !self.pool.is_postgres();
        if keep && let Some(row) = self.worker_rows.get(id) {
            return Ok(Some(row));
        }
        let generation = self.worker_rows.generation();
        let row = crate::store::workers::get_lean(e, id).await?;
        if keep && let Some(row) = &row {
            self.worker_rows.keep(generation, row);
        }
        Ok(row)
    }

    /// When a lease handed out now ends.
    pub(crate) fn lease_deadline(&self, now: i64) -> i64 {
        now.saturating_add(millis(self.config.lease))
    }
}

/// What a workload's search proposes ([`Write::propose`]).
pub(crate) enum Proposal {
    /// These configs (empty when the search is not loaded or its space has no more).
    Now(Vec<Point>),
    /// A model is being fitted off the writer lock: its configs become tasks in a later write.
    Later,
}

/// Makes the proposals that writes leave to be made off the writer lock ([`Write::propose`]), each
/// on its own task ([`Tracker::propose_ahead`]), so that the proposals of several workloads are
/// fitted at once, until `stop`.
pub(crate) async fn proposer(tracker: Arc<Tracker>, stop: CancellationToken) {
    let Some(mut rx) = tracker.ahead_rx.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() else {
        return;
    };
    loop {
        let next = tokio::select! {
            _ = stop.cancelled() => return,
            next = rx.recv() => next,
        };
        let Some((key, work)) = next else { return };
        tokio::spawn(Arc::clone(&tracker).propose_ahead(key, work));
    }
}

/// A duration in (saturated) milliseconds.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// One atomic change: commit it, or drop it to roll back.
pub(crate) struct Write<'a> {
    /// Where proposals to make off the lock go ([`Write::propose`]).
    ahead: &'a tokio::sync::mpsc::UnboundedSender<(SearchKey, AheadWork)>,
    /// `None` once committing.
    tx: Option<Tx>,
    /// The jobs a dispatch group's write holds on PostgreSQL (`Tracker::write_dispatch`): it may
    /// change those alone. `None`: the write holds the whole database.
    held: Option<HashSet<JobId>>,
    /// The tracker's instance number (see `Tracker::instance`).
    instance: u64,
    /// On PostgreSQL, the version of every unfinished workload when this write began (see
    /// `Searches::keep_current`); `None` on SQLite.
    versions: Option<HashMap<SearchKey, i64>>,
    searches: MutexGuard<'a, Searches>,
    now: i64,
    /// Searches loaded or created by this write; forgotten if it does not commit.
    touched: HashSet<SearchKey>,
    /// Configs that got a task in this write, per workload.
    proposed: HashMap<SearchKey, HashSet<Point>>,
    /// Outcomes of the trials this write finished, per workload, in order.
    observed: HashMap<SearchKey, Vec<Observed>>,
    /// Jobs whose transfer prior this write built; forgotten if it does not commit (a job id of a
    /// rolled-back submission is handed out again).
    priors: Vec<PriorKey>,
    /// Workloads (or whole jobs, `None`) that stopped: their searches go after the commit.
    stopped: Vec<(JobId, Option<u32>)>,
    /// Jobs to announce to watchers after the commit.
    changed: BTreeSet<JobId>,
    /// How many tasks became pending (about as many long-polling workers are woken after the
    /// commit: `Events::tasks_ready`).
    tasks_ready: u64,
    /// How many tasks this write leased: the other trackers on PostgreSQL are told only of the
    /// tasks that became pending beyond them (see [`Write::commit`]).
    leased: u64,
    /// Workers this write read and marked seen (at `now`): a group commit holds many calls of the
    /// same worker (a lease, a heartbeat, reports), which read and touch its row once.
    pub(crate) workers: HashMap<crate::model::WorkerId, crate::store::workers::WorkerRow>,
    /// Workload rows as this write last stored them (see `Tracker::workload`): a report reads its
    /// workload three times (its record, its trial, the next proposal) and a group holds many
    /// reports of one workload. Only rows this write wrote whole are kept; any other change of a
    /// workload row forgets them all.
    workload_rows: HashMap<SearchKey, crate::store::workloads::WorkloadRow>,
    /// Workloads whose progress (`finish_trial`) changed in `workload_rows` and is not stored
    /// yet: a group of reports finishes many trials of one workload, and each stored its row
    /// (one statement per report); the row is now stored once, before the commit or before any
    /// other statement on `job_workloads` ([`Write::settled`]).
    unsaved: BTreeSet<SearchKey>,
    /// Jobs whose `updated_ms` this write set already (to `now`, the same for all its rows).
    jobs_touched: HashSet<JobId>,
    /// Outstanding (pending or leased) tuning tasks per workload, once counted in this write and
    /// kept in step by its own changes (a task finished, a task proposed), so that each report of
    /// a group does not count them again. Anything else that changes them forgets the count.
    outstanding: HashMap<SearchKey, u32>,
    /// Job rows read by this write's reports (`Write::job_row`): a group holds hundreds of reports
    /// of a few jobs, each of which read its job's row. A change of a job's row inside a group
    /// (running, done, a note) forgets it (`Write::forget_job`); its `updated_ms` (set by
    /// `Tracker::touch_job`) is not followed, nothing a report does reads it.
    jobs: HashMap<JobId, Arc<crate::store::jobs::JobRow>>,
    /// The tracker's kept worker rows, dropped when this write ends if it changed a worker's row.
    worker_rows: &'a crate::changes::WorkerRows,
    workers_changed: bool,
    finished: bool,
}

impl Write<'_> {
    /// The transaction's connection.
    pub(crate) fn conn(&mut self) -> Exec<'_> {
        // `tx` is only taken by `commit`, which consumes the write.
        self.tx.as_mut().expect("a write keeps its transaction until it commits").exec()
    }

    /// The time this write happens at (one clock reading for all its rows).
    pub(crate) fn now(&self) -> i64 {
        self.now
    }

    /// Notes that this write holds job `id`'s lock (a lease took it).
    pub(crate) fn hold(&mut self, id: JobId) {
        if let Some(held) = &mut self.held {
            held.insert(id);
        }
    }

    /// Fails unless this write holds job `id` (see `held`): a dispatch group that meets a job it
    /// did not lock fails, and its changes run again, each in a write holding the whole database
    /// (`commits`).
    pub(crate) fn holding(&self, id: JobId) -> Result<()> {
        match &self.held {
            Some(held) if !held.contains(&id) => {
                Err(crate::error::Error::Internal(format!("job {id} was changed by a write that does not hold it")))
            }
            _ => Ok(()),
        }
    }

    /// The search of a workload, if loaded.
    pub(crate) fn search(&self, key: SearchKey) -> Option<&Search> {
        self.searches.get(key)
    }

    /// Installs the search of a workload. It was read through this write's transaction, so it
    /// already holds the outcomes this write finished for it.
    pub(crate) fn insert_search(&mut self, key: SearchKey, search: Search) {
        self.touched.insert(key);
        self.observed.remove(&key);
        self.searches.insert(key, search);
        if let Some(versions) = &self.versions {
            // Read under the writer lock: it mirrors the version this write began with (0 for a
            // workload this write made).
            self.searches.set_version(key, versions.get(&key).copied().unwrap_or(0));
        }
    }

    /// The tuner of a search another tracker made stale (see `Searches::stale_tuner`).
    pub(crate) fn stale_tuner(&self, key: SearchKey) -> Option<Arc<dyn crate::tuner::Tuner>> {
        self.searches.stale_tuner(key)
    }

    /// A transfer prior of a job, if built.
    pub(crate) fn prior(&self, key: &PriorKey) -> Option<Arc<Prior>> {
        self.searches.prior(key)
    }

    /// Keeps a transfer prior of a job for its workloads' searches.
    pub(crate) fn insert_prior(&mut self, key: PriorKey, prior: Arc<Prior>) {
        self.priors.push(key.clone());
        self.searches.insert_prior(key, prior);
    }

    /// Up to `n` configs the workload's search proposes next (empty when it is not loaded, or its
    /// space has no more). A model's proposal is CPU work (a fit): it is made off the writer lock,
    /// on a blocking thread, while other writes go on; the search counts it as outstanding until a
    /// later write ([`Tracker::propose_ahead`]) turns it into tasks, here. The configs are those
    /// the tuner chooses from what is known now, as if it had been awaited here.
    pub(crate) async fn propose(&mut self, key: SearchKey, n: usize) -> Result<Proposal> {
        let pending = self.proposed.get(&key);
        let fresh = self.observed.get(&key).map_or(&[][..], Vec::as_slice);
        let Some(search) = self.searches.get_mut(key) else { return Ok(Proposal::Now(Vec::new())) };
        match search.take_ready(pending, n) {
            Some(points) if !points.is_empty() => return Ok(Proposal::Now(points)),
            // Every config of it got a task meanwhile, or the space has no more: asked again here.
            Some(_) => {}
            None if search.computing() => return Ok(Proposal::Later),
            None => {
                if search.proposes_ahead() && !self.ahead.is_closed() {
                    let work = search.start_ahead(pending, fresh, n);
                    if self.ahead.send((key, work)).is_ok() {
                        return Ok(Proposal::Later);
                    }
                    search.cancel_ahead();
                }
            }
        }
        Ok(Proposal::Now(search.propose(pending, fresh, n).await?))
    }

    /// Hands a workload's search the configs computed for it off the lock (see [`Write::propose`]);
    /// false when the search is not the one they were computed for (it was reloaded or stopped).
    pub(crate) fn deliver(&mut self, key: SearchKey, work_generation: u64, points: Vec<Point>) -> bool {
        self.searches.get_mut(key).is_some_and(|s| s.deliver(work_generation, points))
    }

    /// How many configs a workload's search has coming from a proposal made off the lock (0 when
    /// none, or the search is not loaded): they count as outstanding.
    pub(crate) fn ahead(&self, key: SearchKey) -> u32 {
        self.searches.get(key).map_or(0, |s| u32::try_from(s.ahead()).unwrap_or(u32::MAX))
    }

    /// Whether a workload's proposal made off the lock is ready to become tasks.
    pub(crate) fn ready(&self, key: SearchKey) -> bool {
        self.searches.get(key).is_some_and(Search::ready)
    }

    /// Forgets a workload's ready proposal that will not become tasks.
    pub(crate) fn drop_ready(&mut self, key: SearchKey) {
        if let Some(search) = self.searches.get_mut(key) {
            search.drop_ready();
        }
    }

    /// The search's chance that an untried config of the workload is >= 2% faster than its best
    /// (`None` when the search is not loaded or its tuner does not model the space).
    pub(crate) async fn chance(&self, key: SearchKey) -> Result<Option<f64>> {
        match self.searches.get(key) {
            Some(search) => search.chance(self.observed.get(&key).map_or(&[][..], Vec::as_slice)).await,
            None => Ok(None),
        }
    }

    /// The outcomes of a workload's finished trials in the order they finished, this write's
    /// included (empty when its search is not loaded).
    pub(crate) fn observations(&self, key: SearchKey) -> Vec<Observed> {
        let fresh = self.observed.get(&key).map_or(&[][..], Vec::as_slice);
        self.searches.get(key).map(|s| s.observations(fresh).collect()).unwrap_or_default()
    }

    /// Notes that `config` got a task.
    pub(crate) fn proposed(&mut self, key: SearchKey, config: Point) {
        self.proposed.entry(key).or_default().insert(config);
    }

    /// Notes that a trial of the workload finished with `outcome`.
    pub(crate) fn observed(&mut self, key: SearchKey, outcome: Observed) {
        self.observed.entry(key).or_default().push(outcome);
    }

    /// Notes that a workload (or a whole job, `idx` `None`) stopped: its search can go.
    pub(crate) fn stop_search(&mut self, job: JobId, idx: Option<u32>) {
        self.stopped.push((job, idx));
    }

    /// How many stops this write noted ([`Write::stop_search`]): a change that stops a workload
    /// or a job may change tasks other than the one at hand (it cancels the outstanding ones).
    pub(crate) fn stops(&self) -> usize {
        self.stopped.len()
    }

    /// Notes that a job changed.
    pub(crate) fn job_changed(&mut self, job: JobId) {
        self.changed.insert(job);
    }

    /// A workload row as this write last stored it, if it did.
    pub(crate) fn workload_row(&self, key: SearchKey) -> Option<&crate::store::workloads::WorkloadRow> {
        self.workload_rows.get(&key)
    }

    /// Keeps `row`, just read or stored whole by this write, for its next reads.
    pub(crate) fn remember_workload(&mut self, row: &crate::store::workloads::WorkloadRow) {
        self.workload_rows.insert((row.job_id, row.idx), row.clone());
    }

    /// Keeps `row`, whose progress changed, to store before the commit (see `unsaved`).
    pub(crate) fn save_later(&mut self, row: &crate::store::workloads::WorkloadRow) {
        self.remember_workload(row);
        self.unsaved.insert((row.job_id, row.idx));
    }

    /// Stores the progress of every workload row kept unsaved ([`Write::save_later`]).
    async fn save_unsaved(&mut self) -> Result<()> {
        for key in std::mem::take(&mut self.unsaved) {
            if let Some(row) = self.workload_rows.get(&key) {
                let tx = self.tx.as_mut().expect("a write keeps its transaction until it commits");
                crate::store::workloads::save_progress(tx.exec(), row).await?;
            }
        }
        Ok(())
    }

    /// The transaction's connection, with every unsaved workload row stored first: for any
    /// statement on `job_workloads` other than `add_proposed` (which only adds to `proposed`,
    /// a column the progress leaves alone), so that none reads or overwrites an older row.
    pub(crate) async fn settled(&mut self) -> Result<Exec<'_>> {
        self.save_unsaved().await?;
        Ok(self.conn())
    }

    /// Notes that `n` more tasks of a workload were proposed (its stored `proposed` grew by `n`).
    pub(crate) fn proposed_more(&mut self, key: SearchKey, n: u32) {
        if let Some(row) = self.workload_rows.get_mut(&key) {
            row.proposed += n;
        }
    }

    /// Job `id`'s row as read earlier in this write, if it was and has not changed since.
    pub(crate) fn job_row(&self, id: JobId) -> Option<&Arc<crate::store::jobs::JobRow>> {
        self.jobs.get(&id)
    }

    /// Keeps `row`, just read, for this write's next reads of its job (shared: each report and
    /// leased task of a group takes the row, which a clone copied a dozen heap values of).
    pub(crate) fn remember_job(&mut self, row: Arc<crate::store::jobs::JobRow>) {
        self.jobs.insert(row.id, row);
    }

    /// Forgets the kept row of job `id`: this write changed it.
    pub(crate) fn forget_job(&mut self, id: JobId) {
        self.jobs.remove(&id);
    }

    /// Forgets every kept workload row: some row changed in a way they do not follow. Rows not
    /// stored yet would stay (they hold what the store has not seen), but there are none after
    /// such a change: it ran through [`Write::settled`], which stored them first.
    pub(crate) fn forget_workloads(&mut self) {
        let unsaved = &self.unsaved;
        self.workload_rows.retain(|key, _| unsaved.contains(key));
    }

    /// The outstanding tuning tasks of a workload as counted earlier in this write, if they were.
    pub(crate) fn outstanding(&self, key: SearchKey) -> Option<u32> {
        self.outstanding.get(&key).copied()
    }

    /// Keeps `n`, just counted, as the workload's outstanding tuning tasks.
    pub(crate) fn counted_outstanding(&mut self, key: SearchKey, n: u32) {
        self.outstanding.insert(key, n);
    }

    /// Adjusts a kept count of outstanding tuning tasks: `more` proposed, `fewer` finished.
    pub(crate) fn outstanding_changed(&mut self, key: SearchKey, more: u32, fewer: u32) {
        if let Some(n) = self.outstanding.get_mut(&key) {
            *n = (*n + more).saturating_sub(fewer);
        }
    }

    /// Forgets the kept count of a workload's outstanding tasks (some were cancelled).
    pub(crate) fn forget_outstanding(&mut self, key: SearchKey) {
        self.outstanding.remove(&key);
    }

    /// Whether job `id` still needs its `updated_ms` set in this write (true once per job).
    pub(crate) fn first_touch(&mut self, id: JobId) -> bool {
        self.jobs_touched.insert(id)
    }

    /// Notes that this write changed a worker's row (its registration, quarantine or reference
    /// time): the rows kept between writes are dropped when it ends (`changes::WorkerRows`).
    pub(crate) fn worker_changed(&mut self) {
        self.workers_changed = true;
    }

    /// Notes that `n` tasks became pending.
    pub(crate) fn tasks_ready(&mut self, n: u64) {
        self.tasks_ready = self.tasks_ready.saturating_add(n);
    }

    /// Notes that this write leased `n` tasks.
    pub(crate) fn leased(&mut self, n: u64) {
        self.leased = self.leased.saturating_add(n);
    }

    /// Commits, brings the searches in step, then tells watchers and waiting workers.
    pub(crate) async fn commit(mut self, events: &Events) -> Result<()> {
        self.save_unsaved().await?;
        let mut tx = self.tx.take().expect("a write commits once");
        let mut bumped = Vec::new();
        if self.versions.is_some() {
            // Other trackers learn from the versions which searches this write changed, and from
            // the notification (sent at commit) that tasks became pending.
            let mut keys: Vec<SearchKey> = self.proposed.keys().chain(self.observed.keys()).copied().collect();
            keys.sort_unstable();
            keys.dedup();
            if !keys.is_empty() {
                bumped = crate::store::workloads::bump_versions(&mut tx, &keys).await?;
            }
            // Tasks this write's own leases took (its reports' proposals, mostly: its workers
            // wait on its jobs) are none another tracker's waiting leases would find: telling it
            // of them woke leases that read the database to find nothing (with two trackers,
            // nearly twice the lease statements of one, 2026-11-29).
            let remote = self.tasks_ready.saturating_sub(self.leased);
            if remote > 0 {
                // `instance:n`, so that other trackers wake as few of their waiting leases.
                let payload = format!("{}:{}", self.instance, remote);
                crate::store::notify(&mut tx, crate::store::TASKS_CHANNEL, &payload).await?;
            }
            if !self.changed.is_empty() {
                let ids: Vec<String> = self.changed.iter().map(JobId::to_string).collect();
                let payload = format!("{}:{}", self.instance, ids.join(","));
                crate::store::notify(&mut tx, crate::store::JOBS_CHANNEL, &payload).await?;
            }
        }
        tx.commit().await?;
        for (job, idx, version) in bumped {
            self.searches.set_version((job, idx), version);
        }
        for (key, configs) in std::mem::take(&mut self.proposed) {
            if let Some(search) = self.searches.get_mut(key) {
                search.take(configs);
            }
        }
        for (key, outcomes) in std::mem::take(&mut self.observed) {
            if let Some(search) = self.searches.get_mut(key) {
                search.observe(outcomes);
            }
        }
        for (job, idx) in std::mem::take(&mut self.stopped) {
            self.searches.remove(job, idx);
        }
        self.finished = true;
        for job in &self.changed {
            events.job_changed(*job);
        }
        if self.tasks_ready > 0 {
            events.tasks_ready(Some(u32::try_from(self.tasks_ready).unwrap_or(u32::MAX)));
        }
        Ok(())
    }
}

impl Drop for Write<'_> {
    fn drop(&mut self) {
        if self.workers_changed {
            // Committed (`commit` ends here) or rolled back: rows read before or during it may
            // be stale either way.
            self.worker_rows.changed();
        }
        if !self.finished {
            // Rolled back (or cancelled while committing, when nobody knows): whatever this write
            // loaded or proposed is reloaded from the database when next needed.
            let keys: Vec<SearchKey> = self
                .touched
                .drain()
                .chain(self.proposed.keys().copied())
                .chain(self.observed.keys().copied())
                .collect();
            self.searches.remove_keys(keys, &self.priors);
        }
    }
}
