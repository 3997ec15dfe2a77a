//! What the database says after a load run, read directly (not through the tracker): every job
//! ended, no task lost or stuck, no duplicate record, as many records as trials.

use std::path::Path;

use serde::Serialize;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{Connection, SqliteConnection};

/// The database's account of a run.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct DbCheck {
    /// Jobs in the database.
    pub jobs: i64,
    /// Jobs not `done`.
    pub jobs_not_done: i64,
    /// Tasks.
    pub tasks: i64,
    /// Tasks not `done` (pending, leased or cancelled: lost or stuck).
    pub tasks_not_done: i64,
    /// Done tuning tasks with no record of their own (and not reused from another job).
    pub tasks_without_record: i64,
    /// Records.
    pub records: i64,
    /// Records with status `device_lost` (a task whose leases kept expiring).
    pub device_lost: i64,
    /// Tasks with more than one record for the same position.
    pub duplicate_task_records: i64,
    /// Measurement keys (job, workload, template, version, config, finalist position) with more than
    /// one record.
    pub duplicate_measurements: i64,
    /// The trials the jobs asked for (capped at each workload's space).
    pub trials_expected: i64,
    /// Workloads whose tuning records are not as many as their trials.
    pub workloads_short: i64,
    /// Workloads whose stored progress (`done`) is not their done tuning tasks, or whose tasks'
    /// trial numbers are not 1 ..= done, each once.
    pub workloads_miscounted: i64,
}

impl DbCheck {
    /// Lost tasks: not done, or done without their record.
    pub fn lost(&self) -> i64 {
        self.tasks_not_done + self.tasks_without_record
    }

    /// Duplicate records of either kind.
    pub fn duplicates(&self) -> i64 {
        self.duplicate_task_records + self.duplicate_measurements
    }

    /// Whether the run kept everything: every job done, 0 lost, 0 duplicates, records = trials.
    pub fn clean(&self) -> bool {
        self.jobs > 0
            && self.jobs_not_done == 0
            && self.lost() == 0
            && self.duplicates() == 0
            && self.workloads_short == 0
            && self.workloads_miscounted == 0
            && self.device_lost == 0
    }
}

/// Counts of jobs that ended and tuning records so far, for watching a run.
pub(crate) async fn progress(conn: &mut SqliteConnection) -> sqlx::Result<(i64, i64)> {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM jobs WHERE state NOT IN ('queued', 'running')), (SELECT count(*) FROM records)",
    )
    .fetch_one(conn)
    .await
}

/// Tasks leased to workers whose name starts with `prefix`.
pub(crate) async fn held_by(conn: &mut SqliteConnection, prefix: &str) -> sqlx::Result<Vec<i64>> {
    let pattern = format!("{prefix}%");
    sqlx::query_scalar(
        "SELECT t.id FROM tasks t JOIN workers w ON w.id = t.worker_id WHERE t.state = 'leased' AND w.name LIKE ?",
    )
    .bind(pattern)
    .fetch_all(conn)
    .await
}

/// How many of `tasks` are done.
pub(crate) async fn done_among(conn: &mut SqliteConnection, tasks: &[i64]) -> sqlx::Result<i64> {
    let ids = serde_json::to_string(tasks).unwrap_or_else(|_| "[]".into());
    sqlx::query_scalar("SELECT count(*) FROM tasks WHERE state = 'done' AND id IN (SELECT value FROM json_each(?))")
        .bind(ids)
        .fetch_one(conn)
        .await
}

/// A read-only connection to the database at `path`.
pub(crate) async fn connect(path: &Path) -> sqlx::Result<SqliteConnection> {
    SqliteConnection::connect_with(&SqliteConnectOptions::new().filename(path).read_only(true)).await
}

/// Checks the database at `path`.
pub async fn check(path: &Path) -> anyhow::Result<DbCheck> {
    let mut conn = connect(path).await?;
    let one = |sql: &'static str| sqlx::query_scalar::<_, i64>(sql);
    let c = &mut conn;
    Ok(DbCheck {
        jobs: one("SELECT count(*) FROM jobs").fetch_one(&mut *c).await?,
        jobs_not_done: one("SELECT count(*) FROM jobs WHERE state <> 'done'").fetch_one(&mut *c).await?,
        tasks: one("SELECT count(*) FROM tasks").fetch_one(&mut *c).await?,
        tasks_not_done: one("SELECT count(*) FROM tasks WHERE state <> 'done'").fetch_one(&mut *c).await?,
        tasks_without_record: one(
            "SELECT count(*) FROM tasks t WHERE t.kind = 'tuning' AND t.state = 'done' AND t.reused = 0 \
             AND NOT EXISTS (SELECT 1 FROM records r WHERE r.task_id = t.id AND r.id = t.record_id)",
        )
        .fetch_one(&mut *c)
        .await?,
        records: one("SELECT count(*) FROM records").fetch_one(&mut *c).await?,
        device_lost: one("SELECT count(*) FROM records WHERE status = 'device_lost'").fetch_one(&mut *c).await?,
        duplicate_task_records: one(
            "SELECT count(*) FROM (SELECT 1 FROM records GROUP BY task_id, finalist_pos HAVING count(*) > 1)",
        )
        .fetch_one(&mut *c)
        .await?,
        duplicate_measurements: one(
            "SELECT count(*) FROM (SELECT 1 FROM records \
             GROUP BY job_id, workload_key, template, template_version, config_index, finalist_pos HAVING count(*) > 1)",
        )
        .fetch_one(&mut *c)
        .await?,
        trials_expected: one("SELECT coalesce(sum(min(trials_target, space_size)), 0) FROM job_workloads")
            .fetch_one(&mut *c)
            .await?,
        workloads_short: one(
            "SELECT count(*) FROM job_workloads w WHERE min(w.trials_target, w.space_size) <> \
             (SELECT count(*) FROM records r JOIN tasks t ON t.id = r.task_id \
              WHERE t.job_id = w.job_id AND t.workload_idx = w.idx AND t.kind = 'tuning')",
        )
        .fetch_one(&mut *c)
        .await?,
        workloads_miscounted: one(MISCOUNTED).fetch_one(&mut *c).await?,
    })
}

/// The count of [`DbCheck::workloads_miscounted`] (the same SQL on both databases).
pub(crate) const MISCOUNTED: &str = "SELECT count(*) FROM job_workloads w \
     JOIN (SELECT job_id, workload_idx, count(*) AS n, count(DISTINCT trial) AS distinct_trials, \
                  coalesce(min(trial), 1) AS first, coalesce(max(trial), 0) AS last \
           FROM tasks WHERE kind = 'tuning' AND state = 'done' GROUP BY job_id, workload_idx) AS t \
       ON t.job_id = w.job_id AND t.workload_idx = w.idx \
     WHERE t.n <> w.done OR t.distinct_trials <> w.done OR t.first <> 1 OR t.last <> w.done";
