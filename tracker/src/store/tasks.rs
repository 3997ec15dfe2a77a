//! Queries on `tasks`.

use tensortune_kernels::Workload;

use super::{Exec, Json, from_row, json, on, small, sql};
use crate::error::Result;
use crate::model::{Finalist, JobId, RecordId, TaskId, TaskKind, TaskState, WorkerId};

/// The `config_index` of a finalist task, which has no config of its own. No config has it, so
/// `tasks_config_unique` also keeps a workload to one finalist task.
const FINALIST_CONFIG_INDEX: i64 = -1;

from_row! {
    /// A task as stored.
    #[derive(Clone, Debug)]
    pub(crate) struct TaskRow {
        pub(crate) id: TaskId,
        pub(crate) job_id: JobId,
        pub(crate) workload_idx: u32 as i64,
        pub(crate) kind: TaskKind,
        /// The template of a tuning task's config ('' and 0 for a finalist task, whose finalists each
        /// name theirs).
        pub(crate) template: String,
        pub(crate) template_version: u32 as i64,
        /// The config of a tuning task (-1 and empty for a finalist task).
        pub(crate) config_index: i64,
        pub(crate) config: String,
        /// The finalists of a finalist task, in the order the worker reports them.
        pub(crate) finalists: Json<Vec<Finalist>> as String,
        pub(crate) state: TaskState,
        pub(crate) worker_id: Option<WorkerId>,
        pub(crate) attempts: u32 as i64,
        /// A tuning task's record; a finalist task's winning re-measurement (the first one when none
        /// was ok).
        pub(crate) record_id: Option<RecordId>,
    }
}

from_row! {
    /// A task as [`lease`] returns it: its own fields; its job's and workload's come from their rows.
    #[derive(Clone, Debug)]
    pub(crate) struct Leased {
        pub(crate) id: TaskId,
        pub(crate) job_id: JobId,
        pub(crate) workload_idx: u32 as i64,
        pub(crate) template: String,
        pub(crate) template_version: u32 as i64,
        pub(crate) config: String,
        pub(crate) config_index: i64,
        pub(crate) lease_expires_ms: i64,
        pub(crate) kind: TaskKind,
        pub(crate) finalists: Json<Vec<Finalist>> as String,
        pub(crate) attempts: u32 as i64,
    }
}

/// A leased task with everything a worker needs to measure it.
#[derive(Clone, Debug)]
pub(crate) struct LeasedTask {
    pub(crate) id: TaskId,
    pub(crate) job_id: JobId,
    pub(crate) workload: Json<Workload>,
    pub(crate) workload_key: String,
    /// A tuning task's template ('' and 0 for a finalist task: each finalist names its own).
    pub(crate) template: String,
    pub(crate) template_version: u32,
    pub(crate) config: String,
    pub(crate) config_index: i64,
    pub(crate) samples: u32,
    pub(crate) lease_expires_ms: i64,
    pub(crate) flush_l2: bool,
    /// The job's regime (`burst` or `sustained`).
    pub(crate) regime: String,
    /// The job's measurements skip their energy window.
    pub(crate) no_energy: bool,
    pub(crate) kind: TaskKind,
    pub(crate) finalists: Json<Vec<Finalist>>,
    pub(crate) finalist_rounds: u32,
    /// Leases of the task so far, this one included: the lease's serial.
    pub(crate) attempts: u32,
}

/// A task to insert: pending, or already done when an identical record exists.
pub(crate) struct NewTask<'a> {
    pub(crate) job_id: JobId,
    pub(crate) workload_idx: u32,
    pub(crate) template: &'a str,
    pub(crate) template_version: u32,
    pub(crate) config_index: u64,
    pub(crate) config: &'a str,
    /// The record this task reuses; the task is then done.
    pub(crate) reuses: Option<RecordId>,
}

/// Inserts a task.
pub(crate) async fn insert(e: impl Into<Exec<'_>>, t: &NewTask<'_>, now: i64) -> Result<TaskId> {
    let state = if t.reuses.is_some() { TaskState::Done } else { TaskState::Pending };
    Ok(on!(e, |c, pg| sqlx::query_scalar(
        "INSERT INTO tasks (job_id, workload_idx, template, template_version, config_index, config, state, record_id,
                            reused, created_ms, updated_ms)
         VALUES ($1, $2, $9, $10, $3, $4, $5, $6, $7, $8, $8)
         RETURNING id",
    )
    .bind(t.job_id)
    .bind(i64::from(t.workload_idx))
    .bind(i64::try_from(t.config_index).unwrap_or(i64::MAX))
    .bind(t.config)
    .bind(state)
    .bind(t.reuses)
    .bind(t.reuses.is_some())
    .bind(now)
    .bind(t.template)
    .bind(i64::from(t.template_version))
    .fetch_one(c)
    .await)?)
}

/// A pending tuning task of [`insert_pending`], as one element of its JSON array parameter.
#[derive(serde::Serialize)]
pub(crate) struct PendingTask<'a> {
    pub(crate) template: &'a str,
    pub(crate) template_version: u32,
    pub(crate) config_index: u64,
    pub(crate) config: &'a str,
}

/// Inserts pending tuning tasks of workload `idx` of `job`, in their order, in one statement (a
/// proposal inserted each on its own before). Their ids are not returned: nothing needs them
/// until they are leased.
pub(crate) async fn insert_pending(
    e: impl Into<Exec<'_>>,
    job: JobId,
    idx: u32,
    tasks: &[PendingTask<'_>],
    now: i64,
) -> Result<()> {
    if tasks.is_empty() {
        return Ok(());
    }
    on!(e, |c, pg| sqlx::query(if pg {
        "INSERT INTO tasks (job_id, workload_idx, template, template_version, config_index, config, state, reused,
                            created_ms, updated_ms)
         SELECT $1, $2, x.template, x.template_version, x.config_index, x.config, 'pending', FALSE, $3, $3
         FROM json_to_recordset($4::json)
              AS x (template TEXT, template_version BIGINT, config_index BIGINT, config TEXT)"
    } else {
        "INSERT INTO tasks (job_id, workload_idx, template, template_version, config_index, config, state, reused,
                            created_ms, updated_ms)
         SELECT $1, $2, value ->> '$.template', value ->> '$.template_version', value ->> '$.config_index',
                value ->> '$.config', 'pending', FALSE, $3, $3
         FROM json_each($4) ORDER BY key"
    })
    .bind(job)
    .bind(i64::from(idx))
    .bind(now)
    .bind(json(tasks))
    .execute(c)
    .await
    .map(|r| r.rows_affected()))?;
    Ok(())
}

/// Inserts the pending finalist task of workload `idx` of `job`.
pub(crate) async fn insert_finalist(
    e: impl Into<Exec<'_>>,
    job: JobId,
    idx: u32,
    finalists: &[Finalist],
    now: i64,
) -> Result<TaskId> {
    Ok(on!(e, |c, pg| sqlx::query_scalar(
        "INSERT INTO tasks (job_id, workload_idx, kind, template, template_version, config_index, config, finalists,
                            state, created_ms, updated_ms)
         VALUES ($1, $2, 'finalist', '', 0, $3, '', $4, 'pending', $5, $5)
         RETURNING id",
    )
    .bind(job)
    .bind(i64::from(idx))
    .bind(FINALIST_CONFIG_INDEX)
    .bind(json(finalists))
    .bind(now)
    .fetch_one(c)
    .await)?)
}

/// The task `id`.
pub(crate) async fn get(e: impl Into<Exec<'_>>, id: TaskId) -> Result<Option<TaskRow>> {
    Ok(on!(e, |c, pg| sqlx::query_as("SELECT * FROM tasks WHERE id = $1").bind(id).fetch_optional(c).await)?)
}

/// The tasks among `ids` that exist, in no order: a batch of reports reads its tasks at once.
pub(crate) async fn get_many(e: impl Into<Exec<'_>>, ids: &[TaskId]) -> Result<Vec<TaskRow>> {
    let mut e = e.into();
    if let Exec::Sqlite(_) = e {
        return get_many_packed(e, ids).await;
    }
    Ok(on!(e.reborrow(), |c, pg| sqlx::query_as(sql(
        pg,
        "SELECT * FROM tasks WHERE id IN (SELECT CAST(value AS BIGINT) FROM json_each($1))"
    ))
    .bind(json(ids))
    .fetch_all(c)
    .await)?)
}

/// A task row as [`get_many_packed`] packs it: the fields of [`TaskRow`] in its order.
type PackedTask = (i64, i64, i64, String, String, i64, i64, String, String, String, Option<i64>, i64, Option<i64>);

/// [`get_many`] on a SQLite connection: the rows packed into one JSON array, one row for the
/// statement. Each row a statement returns crosses from sqlx's connection thread to the writer's
/// task on its own (a channel message, often a wake-up): ~25 us a row on the loaded CI machine,
/// three times what SQLite spends reading it (2026-11-29); a group reads a hundred or more tasks.
async fn get_many_packed(e: Exec<'_>, ids: &[TaskId]) -> Result<Vec<TaskRow>> {
    let packed: String = on!(e, |c, pg| {
        sqlx::query_scalar(
        "SELECT json_group_array(json_array(id, job_id, workload_idx, kind, template, template_version, config_index,
                                            config, finalists, state, worker_id, attempts, record_id))
         FROM tasks WHERE id IN (SELECT CAST(value AS BIGINT) FROM json_each($1))"
    )
    .bind(json(ids))
    .fetch_one(c)
    .await
    })?;
    let rows: Vec<PackedTask> = serde_json::from_str(&packed)
        .map_err(|e| crate::error::Error::Internal(format!("the tasks read packed did not unpack: {e}")))?;
    rows.into_iter()
        .map(
            |(
                id,
                job_id,
                idx,
                kind,
                template,
                version,
                config_index,
                config,
                finalists,
                state,
                worker_id,
                attempts,
                record_id,
            )| {
                let bad = |what: &str, value: &str| {
                    crate::error::Error::Internal(format!("task {id} has {what} {value:?} in the database"))
                };
                Ok(TaskRow {
                    id,
                    job_id,
                    workload_idx: u32::try_from(idx).map_err(|_| bad("workload index", &idx.to_string()))?,
                    kind: TaskKind::from_column(&kind).ok_or_else(|| bad("kind", &kind))?,
                    template,
                    template_version: u32::try_from(version)
                        .map_err(|_| bad("template version", &version.to_string()))?,
                    config_index,
                    config,
                    finalists: Json::try_from(finalists.clone()).map_err(|_| bad("finalists", &finalists))?,
                    state: TaskState::from_column(&state).ok_or_else(|| bad("state", &state))?,
                    worker_id,
                    attempts: u32::try_from(attempts).map_err(|_| bad("attempts", &attempts.to_string()))?,
                    record_id,
                })
            },
        )
        .collect()
}

/// Tuning tasks of a workload that are pending or leased. Asked after every report: it reads the
/// outstanding tasks of the job alone (`tasks_by_state`; the `+` keeps SQLite from walking every
/// task of the workload through `tasks_config_unique` instead, which made it linear in the trials).
pub(crate) async fn outstanding(e: impl Into<Exec<'_>>, job: JobId, idx: u32) -> Result<u32> {
    let n: i64 = on!(e, |c, pg| sqlx::query_scalar(
        "SELECT COUNT(*) FROM tasks
         WHERE state IN ('pending', 'leased') AND job_id = $1 AND +workload_idx = $2 AND kind = 'tuning'",
    )
    .bind(job)
    .bind(i64::from(idx))
    .fetch_one(c)
    .await)?;
    Ok(small(n))
}

/// Tuning tasks of `job` that are pending or leased, per workload: (workload index, count), only
/// workloads that have some. Asked after every report of a job with a trial budget: on SQLite it
/// reads the job's outstanding tasks alone (`tasks_by_state`), not every task of the job.
pub(crate) async fn outstanding_by_workload(e: impl Into<Exec<'_>>, job: JobId) -> Result<Vec<(u32, u32)>> {
    let rows: Vec<(i64, i64)> = on!(e, |c, pg| sqlx::query_as(if pg {
        "SELECT workload_idx, COUNT(*) FROM tasks
         WHERE state IN ('pending', 'leased') AND job_id = $1 AND kind = 'tuning'
         GROUP BY workload_idx ORDER BY workload_idx"
    } else {
        "SELECT workload_idx, COUNT(*) FROM tasks INDEXED BY tasks_by_state
         WHERE state IN ('pending', 'leased') AND job_id = $1 AND kind = 'tuning'
         GROUP BY workload_idx ORDER BY workload_idx"
    })
    .bind(job)
    .fetch_all(c)
    .await)?;
    Ok(rows.into_iter().map(|(idx, n)| (small(idx), small(n))).collect())
}

/// The configs of a workload that already have a tuning task (in any state): (template, template
/// version, config index).
pub(crate) async fn taken(e: impl Into<Exec<'_>>, job: JobId, idx: u32) -> Result<Vec<(String, u32, i64)>> {
    let rows: Vec<(String, i64, i64)> = on!(e, |c, pg| sqlx::query_as(
        "SELECT template, template_version, config_index FROM tasks
         WHERE job_id = $1 AND workload_idx = $2 AND kind = 'tuning'",
    )
    .bind(job)
    .bind(i64::from(idx))
    .fetch_all(c)
    .await)?;
    Ok(rows.into_iter().map(|(template, version, index)| (template, small(version), index)).collect())
}

/// [`lease`] on SQLite, where the writer lock already keeps a task from being leased twice.
const LEASE_SQLITE: &str =
    "UPDATE tasks SET state = 'leased', worker_id = $1, lease_expires_ms = $2, attempts = attempts + 1,
                          updated_ms = $3
         WHERE id IN (
             SELECT t.id FROM tasks t JOIN jobs j ON j.id = t.job_id
             WHERE t.state = 'pending' AND j.state IN ('queued', 'running') AND j.device_class = $4
               AND CASE t.kind
                   WHEN 'tuning' THEN t.template || '@' || t.template_version IN (SELECT value FROM json_each($5))
                   ELSE NOT EXISTS (
                       SELECT 1 FROM json_each(t.finalists) f
                       WHERE json_extract(f.value, '$.template') || '@' || json_extract(f.value, '$.template_version')
                             NOT IN (SELECT value FROM json_each($5)))
                     -- The winner is confirmed on another worker than the one that timed the
                     -- fastest finalist, when another online one of the class exists.
                     AND ($1 IS NOT (SELECT r.worker_id FROM records r
                                      WHERE r.id = json_extract(t.finalists, '$[0].record_id'))
                          OR NOT EXISTS (SELECT 1 FROM workers o
                                         WHERE o.device_class = $4 AND o.state = 'online' AND o.id != $1
                                           AND o.quarantined IS NULL))
                   END
             ORDER BY t.job_id, t.id
             LIMIT $6)
         RETURNING id, job_id, workload_idx, template, template_version, config, config_index, lease_expires_ms, kind,
                   finalists, attempts";

/// [`lease`] on PostgreSQL: the same choice, job by job, from the jobs whose lock this write holds
/// or can take without waiting (`pg_try_advisory_xact_lock`, see `store::JOB_LOCK_CLASS`): a job
/// another tracker's write is changing is passed over, so that two trackers' groups run at once
/// instead of one waiting for the other's jobs. A tracker's own jobs come first, then the others
/// oldest first: of the `n` trackers serving the database (counted by their connections' names,
/// `store::TRACKER_APPLICATION`), the one ranked `r` by name owns the jobs whose id is `r` modulo
/// `n`. Its workers then lease, and report, mostly its own jobs, which its groups hold while the
/// other trackers' groups hold theirs; a tracker that is gone drops out of the count with its
/// connections. The order only prefers: any tracker leases any job it can lock. The lock is tried
/// once a job, before its tasks are read (a filter on the ordered job list, which PostgreSQL keeps
/// apart from the lateral read), and only for jobs with pending tasks. The chosen rows are locked as well (`SKIP LOCKED`:
/// rows another transaction is leasing are passed over, never waited for or handed out twice).
///
/// Whether a job has pending tasks is a scalar subquery, not `EXISTS`: PostgreSQL turns an
/// `EXISTS` into a semi-join, which a plan made while `tasks` was nearly empty (a new database,
/// before any `ANALYZE`) ran as a filter on `job_id` over every pending task of every job: 12 ms a
/// lease (the median of those over 4 ms in a load run, `auto_explain`, 2026-11-29), 40 ms at 5,000
/// pending tasks, against 1.6 ms as now. The subquery is always one seek of `tasks_by_state` per
/// job, whatever the statistics say.
pub(crate) const LEASE_PG: &str =
    "UPDATE tasks SET state = 'leased', worker_id = $1, lease_expires_ms = $2, attempts = attempts + 1,
                          updated_ms = $3
         WHERE id IN (
             SELECT c.id
             FROM (SELECT j.id FROM jobs j
                   CROSS JOIN (SELECT COUNT(*) AS n,
                                      COUNT(*) FILTER (WHERE a.name < current_setting('application_name')) AS r
                               FROM (SELECT DISTINCT application_name AS name FROM pg_stat_activity
                                     WHERE datname = current_database()
                                       AND application_name LIKE 'tensortune-tracker %') a) k
                   WHERE j.state IN ('queued', 'running') AND j.device_class = $4
                     AND (SELECT p.id FROM tasks p WHERE p.state = 'pending' AND p.job_id = j.id LIMIT 1) IS NOT NULL
                   ORDER BY j.id % GREATEST(k.n, 1) <> k.r, j.id OFFSET 0) j
             CROSS JOIN LATERAL (
                 SELECT t.id FROM tasks t
                 WHERE t.state = 'pending' AND t.job_id = j.id
                   AND CASE t.kind
                       WHEN 'tuning' THEN t.template || '@' || t.template_version
                                          IN (SELECT json_array_elements_text($5::json))
                       ELSE NOT EXISTS (
                           SELECT 1 FROM json_array_elements(t.finalists::json) AS f (value)
                           WHERE (f.value ->> 'template') || '@' || (f.value ->> 'template_version')
                                 NOT IN (SELECT json_array_elements_text($5::json)))
                         AND ($1 IS DISTINCT FROM (SELECT r.worker_id FROM records r
                                                   WHERE r.id = (t.finalists::json -> 0 ->> 'record_id')::bigint)
                              OR NOT EXISTS (SELECT 1 FROM workers o
                                             WHERE o.device_class = $4 AND o.state = 'online' AND o.id != $1
                                               AND o.quarantined IS NULL))
                       END
                 ORDER BY t.id
                 LIMIT $6
                 FOR UPDATE OF t SKIP LOCKED) c
             WHERE pg_try_advisory_xact_lock($7, CAST(j.id % 2147483648 AS INTEGER))
             LIMIT $6)
         RETURNING id, job_id, workload_idx, template, template_version, config, config_index, lease_expires_ms, kind,
                   finalists, attempts";

/// Leases up to `limit` pending tasks to `worker`: tasks of queued or running jobs bound to
/// `device_class` that it can run, oldest job first. It can run a tuning task whose template
/// (spelled `name@version`) is in `templates`, and a finalist task when every finalist's template
/// is (a worker with only some of a job's templates gets only their tasks) and, when another
/// online worker of the class exists, it did not time the fastest finalist.
///
/// Returns the leased tasks' own fields, oldest job first, from the same statement (their details
/// were read in a second one before; the caller takes their jobs' and workloads' fields from the
/// rows the write keeps). On PostgreSQL the write then holds the lock of every leased task's job;
/// jobs another tracker's write holds are passed over (see [`LEASE_PG`]).
pub(crate) async fn lease(
    e: impl Into<Exec<'_>>,
    worker: WorkerId,
    device_class: &str,
    templates: &[String],
    limit: u32,
    expires_ms: i64,
    now: i64,
) -> Result<Vec<Leased>> {
    let mut tasks: Vec<Leased> = on!(e, |c, pg| {
        let query = sqlx::query_as(if pg { LEASE_PG } else { LEASE_SQLITE })
            .bind(worker)
            .bind(expires_ms)
            .bind(now)
            .bind(device_class)
            .bind(json(templates))
            .bind(i64::from(limit));
        // SQLite's writes hold the whole database: it has no job locks to try.
        if pg { query.bind(super::JOB_LOCK_CLASS) } else { query }.fetch_all(c).await
    })?;
    // `RETURNING` gives rows in no promised order.
    tasks.sort_unstable_by_key(|t| (t.job_id, t.id));
    Ok(tasks)
}

/// Renews the leases `worker` holds among `ids` until `expires_ms`, or leaves them as they are when
/// they run longer already (a renewal noted in memory before an outage is stored after the leases
/// got a whole lease back: it must not shorten them); returns the renewed ones.
pub(crate) async fn renew(
    e: impl Into<Exec<'_>>,
    worker: WorkerId,
    ids: &[TaskId],
    expires_ms: i64,
) -> Result<Vec<TaskId>> {
    Ok(on!(e, |c, pg| sqlx::query_scalar(sql(
        pg,
        "UPDATE tasks SET lease_expires_ms = CASE WHEN lease_expires_ms > $3 THEN lease_expires_ms ELSE $3 END
         WHERE state = 'leased' AND worker_id = $1 AND id IN (SELECT CAST(value AS BIGINT) FROM json_each($2))
         RETURNING id",
    ))
    .bind(worker)
    .bind(json(ids))
    .bind(expires_ms)
    .fetch_all(c)
    .await)?)
}

/// The tasks among `ids` that `worker` holds (leased to it now), read without writing: a
/// heartbeat renews them in memory (`changes::Renewals`) and the reaper stores the renewal.
pub(crate) async fn held(e: impl Into<Exec<'_>>, worker: WorkerId, ids: &[TaskId]) -> Result<Vec<TaskId>> {
    Ok(on!(e, |c, pg| sqlx::query_scalar(sql(
        pg,
        "SELECT id FROM tasks
         WHERE state = 'leased' AND worker_id = $1 AND id IN (SELECT CAST(value AS BIGINT) FROM json_each($2))",
    ))
    .bind(worker)
    .bind(json(ids))
    .fetch_all(c)
    .await)?)
}

/// The finalist tasks leased to `worker` now.
pub(crate) async fn leased_finalists(e: impl Into<Exec<'_>>, worker: WorkerId) -> Result<Vec<TaskId>> {
    Ok(on!(e, |c, pg| sqlx::query_scalar(
        "SELECT id FROM tasks WHERE state = 'leased' AND worker_id = $1 AND kind = 'finalist' ORDER BY id"
    )
    .bind(worker)
    .fetch_all(c)
    .await)?)
}

/// Undoes the lease of tasks `ids` made in the same write: pending again, the attempt it counted
/// taken back (a lease withdrawn before its holder heard of it was no attempt).
pub(crate) async fn unlease(e: impl Into<Exec<'_>>, ids: &[TaskId], now: i64) -> Result<()> {
    on!(e, |c, pg| sqlx::query(sql(
        pg,
        "UPDATE tasks SET state = 'pending', lease_expires_ms = NULL, attempts = attempts - 1, updated_ms = $2
         WHERE state = 'leased' AND id IN (SELECT CAST(value AS BIGINT) FROM json_each($1))",
    ))
    .bind(json(ids))
    .bind(now)
    .execute(c)
    .await
    .map(|r| r.rows_affected()))?;
    Ok(())
}

/// Gives every leased task a lease ending at `expires_ms` (at start: the holders may have survived
/// the tracker). Returns how many.
pub(crate) async fn renew_all(e: impl Into<Exec<'_>>, expires_ms: i64) -> Result<u64> {
    Ok(on!(e, |c, pg| sqlx::query("UPDATE tasks SET lease_expires_ms = $1 WHERE state = 'leased'")
        .bind(expires_ms)
        .execute(c)
        .await
        .map(|r| r.rows_affected()))?)
}

/// Marks the task done with its record, numbered `trial` among its workload's finished trials when
/// given (in the same statement: one fewer per report).
pub(crate) async fn complete(
    e: impl Into<Exec<'_>>,
    id: TaskId,
    record: RecordId,
    trial: Option<u32>,
    now: i64,
) -> Result<()> {
    on!(e, |c, pg| sqlx::query(
        "UPDATE tasks SET state = 'done', record_id = $2, lease_expires_ms = NULL, updated_ms = $3,
                          trial = COALESCE($4, trial)
         WHERE id = $1",
    )
    .bind(id)
    .bind(record)
    .bind(now)
    .bind(trial.map(i64::from))
    .execute(c)
    .await
    .map(|r| r.rows_affected()))?;
    Ok(())
}

/// A task finished with its record, for [`complete_many`].
#[derive(serde::Serialize)]
pub(crate) struct Completion {
    pub(crate) id: TaskId,
    pub(crate) record: RecordId,
    pub(crate) trial: Option<u32>,
}

/// [`complete`] for many tasks in one statement (distinct tasks: a task named twice would take
/// either of its records).
pub(crate) async fn complete_many(e: impl Into<Exec<'_>>, done: &[Completion], now: i64) -> Result<()> {
    if done.is_empty() {
        return Ok(());
    }
    on!(e, |c, pg| sqlx::query(if pg {
        "UPDATE tasks SET state = 'done', record_id = x.record, lease_expires_ms = NULL, updated_ms = $2,
                          trial = COALESCE(x.trial, tasks.trial)
         FROM json_to_recordset($1::json) AS x (id BIGINT, record BIGINT, trial BIGINT)
         WHERE tasks.id = x.id"
    } else {
        "UPDATE tasks SET state = 'done', record_id = value ->> '$.record', lease_expires_ms = NULL,
                          updated_ms = $2, trial = COALESCE(value ->> '$.trial', tasks.trial)
         FROM json_each($1)
         WHERE tasks.id = value ->> '$.id'"
    })
    .bind(json(done))
    .bind(now)
    .execute(c)
    .await
    .map(|r| r.rows_affected()))?;
    Ok(())
}

/// Numbers a finished tuning task among its workload's finished trials (1, 2, ...).
pub(crate) async fn set_trial(e: impl Into<Exec<'_>>, id: TaskId, trial: u32) -> Result<()> {
    on!(e, |c, pg| sqlx::query("UPDATE tasks SET trial = $2 WHERE id = $1")
        .bind(id)
        .bind(i64::from(trial))
        .execute(c)
        .await
        .map(|r| r.rows_affected()))?;
    Ok(())
}

/// Leased tasks whose lease ended before `now`.
pub(crate) async fn expired(e: impl Into<Exec<'_>>, now: i64) -> Result<Vec<TaskRow>> {
    Ok(on!(e, |c, pg| sqlx::query_as(
        "SELECT * FROM tasks WHERE state = 'leased' AND lease_expires_ms < $1 ORDER BY id"
    )
    .bind(now)
    .fetch_all(c)
    .await)?)
}

/// Returns a task whose lease expired to the queue; `worker_id` keeps its last holder, whose late
/// report is still accepted until someone else leases it.
pub(crate) async fn release(e: impl Into<Exec<'_>>, id: TaskId, now: i64) -> Result<()> {
    on!(e, |c, pg| sqlx::query(
        "UPDATE tasks SET state = 'pending', lease_expires_ms = NULL, updated_ms = $2 WHERE id = $1"
    )
    .bind(id)
    .bind(now)
    .execute(c)
    .await
    .map(|r| r.rows_affected()))?;
    Ok(())
}

/// Puts every task worker `id` holds back in the queue; returns how many.
pub(crate) async fn release_worker(e: impl Into<Exec<'_>>, id: WorkerId, now: i64) -> Result<u64> {
    let done = on!(e, |c, pg| sqlx::query(
        "UPDATE tasks SET state = 'pending', lease_expires_ms = NULL, updated_ms = $2
         WHERE worker_id = $1 AND state = 'leased'",
    )
    .bind(id)
    .bind(now)
    .execute(c)
    .await
    .map(|r| r.rows_affected()))?;
    Ok(done)
}

/// Cancels task `id` (a finalist task given up on); its holder learns it from its next heartbeat.
pub(crate) async fn cancel(e: impl Into<Exec<'_>>, id: TaskId, now: i64) -> Result<()> {
    on!(e, |c, pg| sqlx::query(
        "UPDATE tasks SET state = 'cancelled', lease_expires_ms = NULL, updated_ms = $2 WHERE id = $1"
    )
    .bind(id)
    .bind(now)
    .execute(c)
    .await
    .map(|r| r.rows_affected()))?;
    Ok(())
}

/// The finalist tasks of `job`, by workload.
pub(crate) async fn finalist_tasks(e: impl Into<Exec<'_>>, job: JobId) -> Result<Vec<TaskRow>> {
    Ok(on!(e, |c, pg| sqlx::query_as(
        "SELECT * FROM tasks WHERE job_id = $1 AND kind = 'finalist' ORDER BY workload_idx"
    )
    .bind(job)
    .fetch_all(c)
    .await)?)
}

/// Cancels the pending and leased tasks of `job` (of workload `idx` only, when given); returns how
/// many. Holders learn it from their next heartbeat.
pub(crate) async fn cancel_unfinished(e: impl Into<Exec<'_>>, job: JobId, idx: Option<u32>, now: i64) -> Result<u64> {
    Ok(on!(e, |c, pg| sqlx::query(
        "UPDATE tasks SET state = 'cancelled', lease_expires_ms = NULL, updated_ms = $3
         WHERE job_id = $1 AND ($2 IS NULL OR workload_idx = $2) AND state IN ('pending', 'leased')",
    )
    .bind(job)
    .bind(idx.map(i64::from))
    .bind(now)
    .execute(c)
    .await
    .map(|r| r.rows_affected()))?)
}

/// On PostgreSQL, inside a dispatch write ([`super::Pool::begin_dispatch`]): locks the jobs of the tasks
/// `wait` (those that exist), waiting for any other tracker's write that holds one, then tries those
/// of the tasks `try_` without waiting. Returns each task's job and whether it is now held
/// (`wait`'s always are). The waits come first and in the order of the jobs' ids, so two writes
/// never wait for each other's locks. Nothing on SQLite, whose writes hold the whole database.
pub(crate) async fn lock_jobs_of(
    e: impl Into<Exec<'_>>,
    try_: &[TaskId],
    wait: &[TaskId],
) -> Result<Vec<(TaskId, JobId, bool)>> {
    // `locked` is computed once, in its subquery's order (`OFFSET 0` keeps that one whole).
    const LOCK: &str = "WITH asked AS (
             SELECT CAST(value AS BIGINT) AS id, FALSE AS wait FROM json_array_elements_text($1::json)
             UNION ALL SELECT CAST(value AS BIGINT), TRUE FROM json_array_elements_text($2::json)),
         owned AS (SELECT t.id, t.job_id, a.wait FROM tasks t JOIN asked a ON a.id = t.id),
         locked AS MATERIALIZED (
             SELECT s.job_id,
                    CASE WHEN s.wait
                         THEN CAST(pg_advisory_xact_lock($3, CAST(s.job_id % 2147483648 AS INTEGER)) AS TEXT) = ''
                         ELSE pg_try_advisory_xact_lock($3, CAST(s.job_id % 2147483648 AS INTEGER)) END AS held
             FROM (SELECT job_id, bool_or(wait) AS wait FROM owned GROUP BY job_id
                   ORDER BY bool_or(wait) DESC, job_id OFFSET 0) s)
         SELECT o.id, o.job_id, l.held FROM owned o JOIN locked l ON l.job_id = o.job_id";
    if try_.is_empty() && wait.is_empty() {
        return Ok(Vec::new());
    }
    let query = || sqlx::query_as(LOCK).bind(json(try_)).bind(json(wait)).bind(super::JOB_LOCK_CLASS);
    Ok(match e.into() {
        Exec::PgPool(c) => query().fetch_all(c).await?,
        Exec::Postgres(c) => query().fetch_all(c).await?,
        Exec::SqlitePool(_) | Exec::Sqlite(_) => Vec::new(),
    })
}
