//! Queries on `job_workloads`.

use tensortune_kernels::Workload;

use super::{Exec, Json, from_row, json, on, small};
use crate::error::Result;
use crate::model::{JobId, RecordId, Status, WorkloadState};

from_row! {
    /// One workload of a job and its progress, with the time of its best record.
    #[derive(Clone, Debug)]
    pub(crate) struct WorkloadRow {
        pub(crate) job_id: JobId,
        pub(crate) idx: u32 as i64,
        pub(crate) workload_key: String,
        pub(crate) workload: Json<Workload> as String,
        pub(crate) trials_target: u32 as i64,
        pub(crate) space_size: i64,
        pub(crate) proposed: u32 as i64,
        pub(crate) done: u32 as i64,
        pub(crate) reused: u32 as i64,
        pub(crate) state: WorkloadState,
        pub(crate) best_record_id: Option<RecordId>,
        /// The best record's score for the job's objective: its time in microseconds (the name's
        /// unit), its energy in mJ, or its energy x delay.
        pub(crate) best_us: Option<f64>,
        pub(crate) stall_best_us: Option<f64>,
        pub(crate) stall_since: u32 as i64,
        /// While finalizing: the state the workload takes once its finalists are done.
        pub(crate) end_state: Option<WorkloadState>,
        /// Set once a re-measurement of its finalists chose the winner (then `best_record_id` is the
        /// winner's re-measurement and stays so).
        pub(crate) finalist_gap: Option<f64>,
        /// When its tuning ended: the model's chance that an untried config is >= 2% faster than the
        /// best found (model tuner only).
        pub(crate) chance_better: Option<f64>,
        /// How much it matters to a model's job (`SubmitJobRequest.weights`); `None` for a job
        /// submitted without weights, which weighs each workload 1 and never caps a curve at the
        /// vendor's time.
        pub(crate) weight: Option<f64>,
    }
}

/// A workload to insert.
pub(crate) struct NewWorkload<'a> {
    pub(crate) idx: u32,
    pub(crate) workload: &'a Workload,
    pub(crate) trials_target: u32,
    pub(crate) space_size: u64,
    pub(crate) weight: Option<f64>,
}

/// Inserts workload `w.idx` of `job`, running.
pub(crate) async fn insert(e: impl Into<Exec<'_>>, job: JobId, w: &NewWorkload<'_>) -> Result<()> {
    on!(e, |c, pg| sqlx::query(
        "INSERT INTO job_workloads (job_id, idx, workload_key, workload, trials_target, space_size, state, weight)
         VALUES ($1, $2, $3, $4, $5, $6, 'running', $7)",
    )
    .bind(job)
    .bind(i64::from(w.idx))
    .bind(w.workload.key())
    .bind(json(w.workload))
    .bind(i64::from(w.trials_target))
    .bind(i64::try_from(w.space_size).unwrap_or(i64::MAX))
    .bind(w.weight)
    .execute(c)
    .await
    .map(|r| r.rows_affected()))?;
    Ok(())
}

/// Workload `idx` of `job`.
pub(crate) async fn get(e: impl Into<Exec<'_>>, job: JobId, idx: u32) -> Result<Option<WorkloadRow>> {
    Ok(on!(e, |c, pg| sqlx::query_as(
        "SELECT w.*, CASE j.objective WHEN 'energy' THEN r.energy_mj WHEN 'edp' THEN r.energy_mj * r.median_us
                            ELSE r.median_us END AS best_us
         FROM job_workloads w JOIN jobs j ON j.id = w.job_id LEFT JOIN records r ON r.id = w.best_record_id
         WHERE w.job_id = $1 AND w.idx = $2",
    )
    .bind(job)
    .bind(i64::from(idx))
    .fetch_optional(c)
    .await)?)
}

/// Every workload of `job`, in order.
pub(crate) async fn list(e: impl Into<Exec<'_>>, job: JobId) -> Result<Vec<WorkloadRow>> {
    Ok(on!(e, |c, pg| sqlx::query_as(
        "SELECT w.*, CASE j.objective WHEN 'energy' THEN r.energy_mj WHEN 'edp' THEN r.energy_mj * r.median_us
                            ELSE r.median_us END AS best_us
         FROM job_workloads w JOIN jobs j ON j.id = w.job_id LEFT JOIN records r ON r.id = w.best_record_id
         WHERE w.job_id = $1 ORDER BY w.idx",
    )
    .bind(job)
    .fetch_all(c)
    .await)?)
}

/// Counts `n` more proposed tasks.
pub(crate) async fn add_proposed(e: impl Into<Exec<'_>>, job: JobId, idx: u32, n: u32) -> Result<()> {
    on!(e, |c, pg| sqlx::query("UPDATE job_workloads SET proposed = proposed + $3 WHERE job_id = $1 AND idx = $2")
        .bind(job)
        .bind(i64::from(idx))
        .bind(i64::from(n))
        .execute(c)
        .await
        .map(|r| r.rows_affected()))?;
    Ok(())
}

/// Stores the progress fields of `w` (counts, best, early-stopping reference, state, finalists).
pub(crate) async fn save_progress(e: impl Into<Exec<'_>>, w: &WorkloadRow) -> Result<()> {
    on!(e, |c, pg| sqlx::query(
        "UPDATE job_workloads SET done = $3, reused = $4, best_record_id = $5, stall_best_us = $6, stall_since = $7,
                                  state = $8, end_state = $9, finalist_gap = $10, chance_better = $11
         WHERE job_id = $1 AND idx = $2",
    )
    .bind(w.job_id)
    .bind(i64::from(w.idx))
    .bind(i64::from(w.done))
    .bind(i64::from(w.reused))
    .bind(w.best_record_id)
    .bind(w.stall_best_us)
    .bind(i64::from(w.stall_since))
    .bind(w.state)
    .bind(w.end_state)
    .bind(w.finalist_gap)
    .bind(w.chance_better)
    .execute(c)
    .await
    .map(|r| r.rows_affected()))?;
    Ok(())
}

/// Workloads of `job` still tuning or re-measuring their finalists.
pub(crate) async fn unfinished(e: impl Into<Exec<'_>>, job: JobId) -> Result<u32> {
    let n: i64 = on!(e, |c, pg| sqlx::query_scalar(
        "SELECT COUNT(*) FROM job_workloads WHERE job_id = $1 AND state IN ('running', 'finalizing')",
    )
    .bind(job)
    .fetch_one(c)
    .await)?;
    Ok(small(n))
}

/// Finished tuning tasks of `job` per workload and record status: (workload index, status, count).
/// Finalist re-measurements are not trials and are not counted.
pub(crate) async fn status_counts(e: impl Into<Exec<'_>>, job: JobId) -> Result<Vec<(u32, Status, u32)>> {
    let rows: Vec<(i64, Status, i64)> = on!(e, |c, pg| sqlx::query_as(
        "SELECT t.workload_idx, r.status, COUNT(*) FROM tasks t JOIN records r ON r.id = t.record_id
         WHERE t.job_id = $1 AND t.kind = 'tuning' AND t.state = 'done'
         GROUP BY t.workload_idx, r.status",
    )
    .bind(job)
    .fetch_all(c)
    .await)?;
    Ok(rows.into_iter().map(|(idx, status, n)| (small(idx), status, small(n))).collect())
}

/// Points every workload whose winner became untrusted at its fastest trusted tuning record (or
/// none); returns those workloads.
pub(crate) async fn drop_untrusted_winners(e: impl Into<Exec<'_>>) -> Result<Vec<(JobId, u32)>> {
    let rows: Vec<(JobId, i64)> = on!(e, |c, pg| sqlx::query_as(
        "UPDATE job_workloads SET best_record_id = (
             SELECT r.id FROM tasks t JOIN records r ON r.id = t.record_id
             WHERE t.job_id = job_workloads.job_id AND t.workload_idx = job_workloads.idx AND t.kind = 'tuning'
               AND r.status = 'ok' AND r.untrusted IS NULL
             ORDER BY r.median_us, r.id LIMIT 1)
         WHERE best_record_id IN (SELECT id FROM records WHERE untrusted IS NOT NULL)
         RETURNING job_id, idx",
    )
    .fetch_all(c)
    .await)?;
    Ok(rows.into_iter().map(|(job, idx)| (job, small(idx))).collect())
}

/// On PostgreSQL: the version of every workload still tuning or re-measuring (see the `version`
/// column). Empty on SQLite, which has no such column and one tracker per file.
pub(crate) async fn versions(e: impl Into<Exec<'_>>) -> Result<Vec<(JobId, u32, i64)>> {
    let rows: Vec<(JobId, i64, i64)> = match e.into() {
        Exec::PgPool(c) => sqlx::query_as(VERSIONS).fetch_all(c).await?,
        Exec::Postgres(c) => sqlx::query_as(VERSIONS).fetch_all(c).await?,
        Exec::SqlitePool(_) | Exec::Sqlite(_) => Vec::new(),
    };
    Ok(rows.into_iter().map(|(job, idx, v)| (job, small(idx), v)).collect())
}

const VERSIONS: &str = "SELECT job_id, idx, version FROM job_workloads WHERE state IN ('running', 'finalizing')";

/// On PostgreSQL: bumps the version of the workloads `keys` (job, index); returns their new
/// versions. Nothing on SQLite.
pub(crate) async fn bump_versions(e: impl Into<Exec<'_>>, keys: &[(JobId, u32)]) -> Result<Vec<(JobId, u32, i64)>> {
    const BUMP: &str = "UPDATE job_workloads SET version = version + 1
         WHERE (job_id, idx) IN (SELECT (k ->> 0)::bigint, (k ->> 1)::bigint FROM json_array_elements($1::json) AS k)
         RETURNING job_id, idx, version";
    let rows: Vec<(JobId, i64, i64)> = match e.into() {
        Exec::PgPool(c) => sqlx::query_as(BUMP).bind(json(keys)).fetch_all(c).await?,
        Exec::Postgres(c) => sqlx::query_as(BUMP).bind(json(keys)).fetch_all(c).await?,
        Exec::SqlitePool(_) | Exec::Sqlite(_) => Vec::new(),
    };
    Ok(rows.into_iter().map(|(job, idx, v)| (job, small(idx), v)).collect())
}
