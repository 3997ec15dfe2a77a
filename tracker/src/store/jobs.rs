//! Queries on `jobs`.

use super::{Exec, Json, from_row, json, on, sql};
use crate::error::Result;
use crate::model::{JobId, JobState};
use crate::tuner::TunerKind;
use tensortune_kernels::energy::{Objective, Regime};

from_row! {
    /// A job as stored.
    #[derive(Clone, Debug)]
    pub(crate) struct JobRow {
        pub(crate) id: JobId,
        pub(crate) state: JobState,
        /// Display name: the template, or the templates joined with '+' (`wmma_gemm+wgmma_gemm`).
        pub(crate) template: String,
        /// The version of a single template; 0 when the job searches several.
        pub(crate) template_version: u32 as i64,
        /// `name@version` of each template the job searches, in slot order (`tuner::Point::slot`).
        pub(crate) templates: Json<Vec<String>> as String,
        pub(crate) tuner: TunerKind,
        pub(crate) device_class: String,
        pub(crate) trials: u32 as i64,
        pub(crate) batch_size: u32 as i64,
        /// The u64 seed's bit pattern.
        pub(crate) seed: i64,
        pub(crate) samples: u32 as i64,
        pub(crate) label: String,
        pub(crate) early_stop_trials: u32 as i64,
        pub(crate) early_stop_margin: f64,
        /// Finalists re-measured per workload (1: none).
        pub(crate) finalists: u32 as i64,
        pub(crate) finalist_rounds: u32 as i64,
        pub(crate) flush_l2: bool,
        /// Whether a model search starts from other workloads' records.
        pub(crate) transfer: bool,
        /// Trials the whole job may measure, shared by expected gain; 0: none.
        pub(crate) total_trials: u32 as i64,
        /// `burst` or `sustained`.
        pub(crate) regime: String,
        /// `time`, `energy` or `edp`.
        pub(crate) objective: String,
        /// The least-energy pick within this fraction of the fastest; 0: off.
        pub(crate) max_slowdown: f64,
        /// Its measurements skip their energy window.
        pub(crate) no_energy: bool,
        /// Why the job failed or was cancelled, or what went wrong on the way to done (workloads that
        /// finished without their finalists).
        pub(crate) error: String,
        pub(crate) created_ms: i64,
        pub(crate) updated_ms: i64,
        pub(crate) finished_ms: Option<i64>,
        /// The token the job was submitted with (its owner); `None` on a tracker without tokens.
        pub(crate) token_id: Option<i64>,
    }
}

impl JobRow {
    /// What the job minimises.
    pub(crate) fn objective(&self) -> Objective {
        Objective::parse(&self.objective).unwrap_or_default()
    }

    /// The tuner's seed.
    pub(crate) fn seed(&self) -> u64 {
        self.seed as u64
    }

    /// Whether tasks of this job may still be proposed and leased.
    pub(crate) fn is_active(&self) -> bool {
        !self.state.is_terminal()
    }
}

/// A job to insert.
pub(crate) struct NewJob<'a> {
    pub(crate) template: &'a str,
    pub(crate) template_version: u32,
    /// `name@version` of each template, in slot order.
    pub(crate) templates: &'a [String],
    pub(crate) tuner: TunerKind,
    pub(crate) device_class: &'a str,
    pub(crate) trials: u32,
    pub(crate) batch_size: u32,
    pub(crate) seed: u64,
    pub(crate) samples: u32,
    pub(crate) label: &'a str,
    pub(crate) early_stop_trials: u32,
    pub(crate) early_stop_margin: f64,
    pub(crate) finalists: u32,
    pub(crate) finalist_rounds: u32,
    pub(crate) flush_l2: bool,
    pub(crate) transfer: bool,
    pub(crate) total_trials: u32,
    pub(crate) regime: Regime,
    pub(crate) objective: Objective,
    pub(crate) max_slowdown: f64,
    pub(crate) no_energy: bool,
    /// The submitting token.
    pub(crate) token_id: Option<i64>,
}

/// Inserts a queued job.
pub(crate) async fn insert(e: impl Into<Exec<'_>>, job: &NewJob<'_>, now: i64) -> Result<JobId> {
    let id = on!(e, |c, pg| {
        sqlx::query_scalar(
        "INSERT INTO jobs (state, template, template_version, tuner, device_class, trials, batch_size, seed, samples,
                           label, early_stop_trials, early_stop_margin, finalists, finalist_rounds, flush_l2,
                           transfer, total_trials, templates, created_ms, updated_ms, token_id, regime, objective,
                           max_slowdown, no_energy)
         VALUES ('queued', $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $18, $17, $17, $19,
                 $20, $21, $22, $23)
         RETURNING id",
    )
    .bind(job.template)
    .bind(i64::from(job.template_version))
    .bind(job.tuner)
    .bind(job.device_class)
    .bind(i64::from(job.trials))
    .bind(i64::from(job.batch_size))
    .bind(job.seed as i64)
    .bind(i64::from(job.samples))
    .bind(job.label)
    .bind(i64::from(job.early_stop_trials))
    .bind(job.early_stop_margin)
    .bind(i64::from(job.finalists))
    .bind(i64::from(job.finalist_rounds))
    .bind(job.flush_l2)
    .bind(job.transfer)
    .bind(i64::from(job.total_trials))
    .bind(now)
    .bind(json(job.templates))
    .bind(job.token_id)
    .bind(job.regime.name())
    .bind(job.objective.name())
    .bind(job.max_slowdown)
    .bind(job.no_energy)
    .fetch_one(c).await
    })?;
    Ok(id)
}

/// The job `id`.
pub(crate) async fn get(e: impl Into<Exec<'_>>, id: JobId) -> Result<Option<JobRow>> {
    Ok(on!(e, |c, pg| sqlx::query_as("SELECT * FROM jobs WHERE id = $1").bind(id).fetch_optional(c).await)?)
}

/// Jobs in `states` (all when empty), newest first, at most `limit`.
pub(crate) async fn list(e: impl Into<Exec<'_>>, states: &[JobState], limit: u32) -> Result<Vec<JobRow>> {
    let names: Vec<&str> = states.iter().map(|s| s.name()).collect();
    Ok(on!(e, |c, pg| sqlx::query_as(sql(
        pg,
        "SELECT * FROM jobs
         WHERE $1 = '[]' OR state IN (SELECT value FROM json_each($1))
         ORDER BY id DESC LIMIT $2",
    ))
    .bind(json(&names))
    .bind(i64::from(limit))
    .fetch_all(c)
    .await)?)
}

/// Jobs that are queued or running, oldest first.
pub(crate) async fn active(e: impl Into<Exec<'_>>) -> Result<Vec<JobRow>> {
    Ok(on!(e, |c, pg| sqlx::query_as("SELECT * FROM jobs WHERE state IN ('queued', 'running') ORDER BY id")
        .fetch_all(c)
        .await)?)
}

/// Marks the queued jobs among `ids` running; returns those that changed.
pub(crate) async fn mark_running(e: impl Into<Exec<'_>>, ids: &[JobId], now: i64) -> Result<Vec<JobId>> {
    Ok(on!(e, |c, pg| sqlx::query_scalar(sql(
        pg,
        "UPDATE jobs SET state = 'running', updated_ms = $2
         WHERE state = 'queued' AND id IN (SELECT CAST(value AS BIGINT) FROM json_each($1))
         RETURNING id",
    ))
    .bind(json(ids))
    .bind(now)
    .fetch_all(c)
    .await)?)
}

/// Records that the job's progress changed.
pub(crate) async fn touch(e: impl Into<Exec<'_>>, id: JobId, now: i64) -> Result<()> {
    on!(e, |c, pg| sqlx::query("UPDATE jobs SET updated_ms = $2 WHERE id = $1")
        .bind(id)
        .bind(now)
        .execute(c)
        .await
        .map(|r| r.rows_affected()))?;
    Ok(())
}

/// Ends the job in a terminal `state`, with `error` saying why when it did not succeed.
pub(crate) async fn finish(e: impl Into<Exec<'_>>, id: JobId, state: JobState, error: &str, now: i64) -> Result<()> {
    debug_assert!(state.is_terminal());
    on!(e, |c, pg| sqlx::query(
        "UPDATE jobs SET state = $2, error = $3, updated_ms = $4, finished_ms = $4 WHERE id = $1"
    )
    .bind(id)
    .bind(state)
    .bind(error)
    .bind(now)
    .execute(c)
    .await
    .map(|r| r.rows_affected()))?;
    Ok(())
}

/// Adds `note` to the job's error text (joined with "; "), for what went wrong without failing it.
pub(crate) async fn add_note(e: impl Into<Exec<'_>>, id: JobId, note: &str, now: i64) -> Result<()> {
    on!(e, |c, pg| sqlx::query(
        "UPDATE jobs SET error = CASE WHEN error = '' THEN $2 ELSE error || '; ' || $2 END, updated_ms = $3
         WHERE id = $1",
    )
    .bind(id)
    .bind(note)
    .bind(now)
    .execute(c)
    .await
    .map(|r| r.rows_affected()))?;
    Ok(())
}
