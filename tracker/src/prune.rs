//! `tensortune-tracker prune --retain-days N`: bounds the store's growth. Records of jobs that
//! ended (done, cancelled or failed) more than N days ago are deleted unless something still needs
//! them: a workload's best, a finalist (the tuning record a finalist was chosen by, and its
//! re-measurement), or another job's task that reused it. Their tasks stay (the job keeps its
//! shape and its counts) with no record. Jobs still queued or running are never touched.
//!
//! One write transaction under the database's write lock, so it is safe while a tracker serves the
//! database: the tracker's writes wait for it, and it for them.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::model::now_ms;
use crate::store::{self, on};
use crate::tracker::Tracker;

/// How often a tracker with `retain_days` prunes.
const PRUNE_PERIOD: Duration = Duration::from_secs(60 * 60);

/// Ids of the records to delete; `$1` is the cutoff (ms since the epoch). Every `NOT IN` list
/// leaves NULLs out: one NULL in it would keep every record. An ended job's records are reached
/// through its tasks (a record's task is of the record's job): SQLite keeps no index on
/// `records` by job for this hourly query alone, as each record insert paid for one (issue 40).
/// PostgreSQL keeps `records_by_job`, which its custom plans of the records page use.
const PRUNABLE_SQLITE: &str = "
    SELECT r.id FROM jobs j JOIN tasks t ON t.job_id = j.id JOIN records r ON r.task_id = t.id
    WHERE j.state IN ('done', 'cancelled', 'failed') AND j.finished_ms IS NOT NULL AND j.finished_ms < $1
      AND r.remeasure = 0
      AND r.id NOT IN (SELECT best_record_id FROM job_workloads WHERE best_record_id IS NOT NULL)
      AND r.id NOT IN (SELECT CAST(json_extract(f.value, '$.record_id') AS INTEGER)
                       FROM tasks t, json_each(t.finalists) f
                       WHERE t.kind = 'finalist' AND json_extract(f.value, '$.record_id') IS NOT NULL)
      AND r.id NOT IN (SELECT record_id FROM tasks
                       WHERE record_id IS NOT NULL AND (kind = 'finalist' OR job_id != r.job_id))";

/// [`PRUNABLE_SQLITE`] in PostgreSQL's JSON dialect.
const PRUNABLE_PG: &str = "
    SELECT r.id FROM records r JOIN jobs j ON j.id = r.job_id
    WHERE j.state IN ('done', 'cancelled', 'failed') AND j.finished_ms IS NOT NULL AND j.finished_ms < $1
      AND NOT r.remeasure
      AND r.id NOT IN (SELECT best_record_id FROM job_workloads WHERE best_record_id IS NOT NULL)
      AND r.id NOT IN (SELECT (f.value ->> 'record_id')::bigint
                       FROM tasks t, json_array_elements(t.finalists::json) AS f (value)
                       WHERE t.kind = 'finalist' AND f.value ->> 'record_id' IS NOT NULL)
      AND r.id NOT IN (SELECT record_id FROM tasks
                       WHERE record_id IS NOT NULL AND (kind = 'finalist' OR job_id != r.job_id))";

/// Detaches the tasks of the records `$1` (a JSON array of ids) from them.
const UNLINK_TASKS: &str =
    "UPDATE tasks SET record_id = NULL WHERE record_id IN (SELECT CAST(value AS BIGINT) FROM json_each($1))";

/// Deletes the records `$1` (a JSON array of ids).
const DELETE_RECORDS: &str = "DELETE FROM records WHERE id IN (SELECT CAST(value AS BIGINT) FROM json_each($1))";

/// What a prune did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PruneSummary {
    /// Records deleted.
    pub records: u64,
}

/// Deletes the superseded records of jobs that ended more than `retain_days` days ago (0: every
/// ended job) from the database `db` names.
pub async fn prune(db: &Path, retain_days: u32) -> anyhow::Result<PruneSummary> {
    crate::config::check_retain_days(retain_days)?;
    let pool = store::open(db).await?;
    let result = prune_pool(&pool, cutoff(retain_days)).await;
    pool.close().await;
    let summary = result.with_context(|| format!("pruning {}", store::redact(&db.to_string_lossy())))?;
    tracing::info!(records = summary.records, retain_days, "pruned superseded records of ended jobs");
    Ok(summary)
}

/// The end time before which ended jobs are pruned, ms since the epoch.
fn cutoff(retain_days: u32) -> i64 {
    now_ms() - i64::from(retain_days) * 24 * 60 * 60 * 1000
}

/// Prunes with the tracker's `retain_days` at start and every [`PRUNE_PERIOD`] until `stop`.
pub(crate) async fn every_period(tracker: Arc<Tracker>, stop: CancellationToken) {
    let Some(days) = tracker.config.retain_days else { return };
    loop {
        match prune_pool(&tracker.pool, cutoff(days)).await {
            Ok(s) if s.records > 0 => {
                tracing::info!(records = s.records, retain_days = days, "pruned superseded records")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "pruning failed; trying again next period"),
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(PRUNE_PERIOD) => {}
        }
    }
}

async fn prune_pool(pool: &store::Pool, cutoff: i64) -> sqlx::Result<PruneSummary> {
    let mut tx = pool.begin_write().await?;
    let ids: Vec<i64> = on!(tx.exec(), |c, pg| sqlx::query_scalar(if pg { PRUNABLE_PG } else { PRUNABLE_SQLITE })
        .bind(cutoff)
        .fetch_all(c)
        .await)?;
    let list = store::json(&ids);
    // Tasks let go of the records first (their foreign key), then the records go.
    let mut deleted = 0;
    for statement in [UNLINK_TASKS, DELETE_RECORDS] {
        deleted = on!(tx.exec(), |c, pg| sqlx::query(store::sql(pg, statement))
            .bind(&list)
            .execute(c)
            .await
            .map(|r| r.rows_affected()))?;
    }
    tx.commit().await?;
    Ok(PruneSummary { records: deleted })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SQLite keeps no index on `records` by job: the query reaches an ended job's records
    /// through its tasks, a seek each, and never walks the records table.
    #[tokio::test]
    async fn the_prunable_records_are_found_through_their_tasks_on_sqlite() {
        let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await.unwrap();
        store::migrator(store::migrations::SQLITE).run(&pool).await.unwrap();
        let plan: Vec<(i64, i64, i64, String)> =
            sqlx::query_as(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {PRUNABLE_SQLITE}")))
                .bind(0_i64)
                .fetch_all(&pool)
                .await
                .unwrap();
        let steps: Vec<&str> = plan.iter().map(|p| p.3.as_str()).collect();
        assert!(steps.iter().any(|s| s.starts_with("SEARCH r USING INDEX sqlite_autoindex_records")), "{steps:?}");
        assert!(!steps.iter().any(|s| s.starts_with("SCAN r")), "{steps:?}");
    }
}
